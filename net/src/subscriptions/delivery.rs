//! Webhook delivery: [`WEBHOOK_DELIVERY_THREADS`] plain threads (`pico-webhooks`) POST signed
//! wake notifications with a small blocking HTTP/1.1 client, so no core ever blocks on a
//! receiver. Results go back into the registry, which schedules bounded retries.
//!
//! Fair across subscriptions: the queue (`queue.rs`) holds at most one waiting delivery per key (a
//! newer wake's replaces an older one's, whose result the registry would ignore anyway) and at
//! most one in flight, and serves subscriptions in turn. A slow or silent receiver so holds one
//! thread for at most [`WEBHOOK_DEADLINE`] per attempt, and the others serve everyone else.
//!
//! Bounded against a hostile receiver: the whole delivery (resolution aside: connect, TLS,
//! request, answer) has [`WEBHOOK_DEADLINE`]; the answer is parsed by `response` with checked
//! arithmetic and read up to [`WEBHOOK_RESPONSE_BYTES_MAX`] bytes. Anything wrong is a failed
//! delivery, retried with back-off; a panic in one is caught and counts as a failed delivery.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::registry::{Clock, Effect, Job, Origin, Outcome};
use super::response::{self, AnswerError, Parsed, WEBHOOK_RESPONSE_BYTES_MAX};
use super::shared::{Shared, TlsCache};
use super::webhook_url::{self, Host, UrlError, WebhookUrl};
use super::DeliveryReport;
use crate::limits::{WEBHOOK_CONNECT_TIMEOUT, WEBHOOK_DEADLINE, WEBHOOK_DELIVERY_THREADS};
use pico_proto::header::PICO_WEBHOOKS;

/// Deliveries that panicked (each caught and counted as a failed delivery), since start.
pub static DELIVERY_PANICS: AtomicU64 = AtomicU64::new(0);

/// Why a delivery failed before its receiver answered with a status.
#[derive(Debug)]
pub enum DeliveryError {
    /// The URL fails the policy (`webhook_url`).
    Url(UrlError),
    /// The receiver's answer is malformed or too large.
    Answer(AnswerError),
    /// The answer goes on past [`WEBHOOK_RESPONSE_BYTES_MAX`] bytes.
    AnswerTooLong,
    /// The host name did not resolve.
    Resolve {
        host: String,
        source: std::io::Error,
    },
    /// None of the host's addresses is one deliveries may go to.
    NoAllowedAddress,
    /// The last allowed address refused or timed out.
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// [`WEBHOOK_DEADLINE`] passed.
    Deadline,
    /// No CA bundle was found for https webhooks.
    NoCaBundle,
    /// A CA file could not be read (its path).
    CaFile {
        path: String,
        source: rustls_pki_types::pem::Error,
    },
    /// A CA file holds no usable certificate (its path).
    NoCaCertificate(String),
    /// The TLS client settings could not be made.
    TlsSetup(rustls::Error),
    /// The TLS connection could not be made.
    Tls(rustls::Error),
    /// The host is no TLS server name.
    ServerName(rustls_pki_types::InvalidDnsNameError),
    /// The URL leads to one of this node's own listeners.
    OwnListener(SocketAddr),
    /// Writing the request failed.
    Send(std::io::Error),
    /// Reading the answer failed.
    Receive(std::io::Error),
}

impl std::fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeliveryError::Url(e) => e.fmt(f),
            DeliveryError::Answer(e) => e.fmt(f),
            DeliveryError::AnswerTooLong => write!(
                f,
                "the answer is longer than {WEBHOOK_RESPONSE_BYTES_MAX} bytes"
            ),
            DeliveryError::Resolve { host, source } => {
                write!(f, "cannot resolve {host}: {source}")
            }
            DeliveryError::NoAllowedAddress => {
                f.write_str("the host has no address deliveries may go to")
            }
            DeliveryError::OwnListener(addr) => write!(
                f,
                "{addr} is this node's own listener: a wake posted to it would write to a \
                 stream and wake again, for ever"
            ),
            DeliveryError::Connect { addr, source } => {
                write!(f, "cannot connect to {addr}: {source}")
            }
            DeliveryError::Deadline => write!(
                f,
                "the receiver took longer than {} ms",
                WEBHOOK_DEADLINE.as_millis()
            ),
            DeliveryError::NoCaBundle => {
                f.write_str("no CA bundle found for https webhooks (set SSL_CERT_FILE)")
            }
            DeliveryError::CaFile { path, source } => write!(f, "{path}: {source}"),
            DeliveryError::NoCaCertificate(path) => {
                write!(f, "{path} holds no usable CA certificate")
            }
            DeliveryError::TlsSetup(e) => write!(f, "TLS setup: {e}"),
            DeliveryError::Tls(e) => e.fmt(f),
            DeliveryError::ServerName(e) => write!(f, "invalid TLS server name: {e}"),
            DeliveryError::Send(e) => write!(f, "sending: {e}"),
            DeliveryError::Receive(e) => write!(f, "receiving: {e}"),
        }
    }
}

impl std::error::Error for DeliveryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DeliveryError::Url(e) => Some(e),
            DeliveryError::Answer(e) => Some(e),
            DeliveryError::Resolve { source, .. } | DeliveryError::Connect { source, .. } => {
                Some(source)
            }
            DeliveryError::CaFile { source, .. } => Some(source),
            DeliveryError::TlsSetup(e) | DeliveryError::Tls(e) => Some(e),
            DeliveryError::ServerName(e) => Some(e),
            DeliveryError::Send(e) | DeliveryError::Receive(e) => Some(e),
            _ => None,
        }
    }
}

impl From<UrlError> for DeliveryError {
    fn from(e: UrlError) -> DeliveryError {
        DeliveryError::Url(e)
    }
}

impl From<AnswerError> for DeliveryError {
    fn from(e: AnswerError) -> DeliveryError {
        DeliveryError::Answer(e)
    }
}

/// The I/O error of a socket read or write: past the deadline if it timed out.
fn io_error(e: std::io::Error, other: fn(std::io::Error) -> DeliveryError) -> DeliveryError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => DeliveryError::Deadline,
        _ => other(e),
    }
}

/// Queues `job`, starting the threads with the first one. `Err` gives the job back when
/// [`QUEUED_DELIVERIES_MAX`](crate::limits::QUEUED_DELIVERIES_MAX) keys are already waiting or
/// no thread runs.
pub(super) fn push(shared: &Arc<Shared>, job: Job) -> Result<(), (Job, &'static str)> {
    shared.deliveries.push(job, || start_threads(shared))
}

/// Starts the delivery threads; how many started.
fn start_threads(shared: &Arc<Shared>) -> usize {
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
    started
}

/// A thread's loop: deliveries in turn until the queue closes.
fn work(shared: &Arc<Shared>) {
    let mut tls: TlsCache = None;
    while let Some(job) = shared.deliveries.take() {
        let deliver = shared.deliver;
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
    if let Err((job, reason)) = push(shared, job) {
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
    let own = shared.own_listeners();
    let result = webhook_url::parse(&job.url)
        .map_err(DeliveryError::Url)
        .and_then(|url| {
            let tls = if url.https {
                let cached = tls.get_or_insert_with(|| client_config().ok());
                Some(cached.clone().ok_or(DeliveryError::NoCaBundle)?)
            } else {
                None
            };
            post(
                &url,
                allow_loopback,
                &own,
                job.body.as_bytes(),
                &signature,
                tls,
            )
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
fn remaining(deadline: Instant) -> Result<Duration, DeliveryError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
        .ok_or(DeliveryError::Deadline)
}

/// Whether `addr` is one of this node's own listeners (`own`, as bound; an unspecified
/// address listens on every address of its port, loopback included).
fn is_own(addr: &SocketAddr, own: &[SocketAddr]) -> bool {
    own.iter().any(|listener| {
        listener.port() == addr.port()
            && (listener.ip() == addr.ip()
                || (listener.ip().is_unspecified() && addr.ip().is_loopback()))
    })
}

/// Connects to the first address of the URL's host that its policy allows: never one of the
/// node's own listeners (`own`), whose answer to a wake would be a write that wakes again.
fn connect(
    url: &WebhookUrl,
    allow_loopback: bool,
    own: &[SocketAddr],
    deadline: Instant,
) -> Result<TcpStream, DeliveryError> {
    let candidates: Vec<SocketAddr> = match &url.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, url.port)],
        Host::Name(name) => (name.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|source| DeliveryError::Resolve {
                host: name.clone(),
                source,
            })?
            .collect(),
    };
    let allowed: Vec<SocketAddr> = candidates
        .into_iter()
        .filter(|addr| webhook_url::address_allowed(url, addr.ip(), allow_loopback))
        .collect();
    if let Some(addr) = allowed.iter().find(|addr| is_own(addr, own)) {
        return Err(DeliveryError::OwnListener(*addr));
    }
    let mut last = DeliveryError::NoAllowedAddress;
    for addr in allowed {
        let timeout = remaining(deadline)?.min(WEBHOOK_CONNECT_TIMEOUT);
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(source) => last = DeliveryError::Connect { addr, source },
        }
    }
    Err(last)
}

/// POSTs `body` and returns the status and (bounded) response body, all within
/// [`WEBHOOK_DEADLINE`].
pub fn post(
    url: &WebhookUrl,
    allow_loopback: bool,
    own: &[SocketAddr],
    body: &[u8],
    signature: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<(u16, Vec<u8>), DeliveryError> {
    let deadline = Instant::now() + WEBHOOK_DEADLINE;
    let tcp = connect(url, allow_loopback, own, deadline)?;
    let mut request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nWebhook-Signature: {signature}\r\nUser-Agent: picomq-webhooks\r\nConnection: close\r\n\r\n",
        url.target,
        url.host_header(),
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let tcp = Deadlined { tcp, deadline };
    match tls {
        None => exchange(tcp, &request),
        Some(config) => {
            let name = match &url.host {
                Host::Ip(ip) => rustls_pki_types::ServerName::IpAddress((*ip).into()),
                Host::Name(name) => rustls_pki_types::ServerName::try_from(name.clone())
                    .map_err(DeliveryError::ServerName)?,
            };
            let conn = rustls::ClientConnection::new(config, name).map_err(DeliveryError::Tls)?;
            exchange(rustls::StreamOwned::new(conn, tcp), &request)
        }
    }
}

/// TLS client settings with the system's CA bundle, built on the first https delivery.
fn client_config() -> Result<Arc<rustls::ClientConfig>, DeliveryError> {
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
    Err(DeliveryError::NoCaBundle)
}

/// TLS client settings trusting the CA certificates of one PEM file.
fn client_config_from(pem_path: &str) -> Result<Arc<rustls::ClientConfig>, DeliveryError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pem_path)
        .map_err(|source| DeliveryError::CaFile {
            path: pem_path.to_string(),
            source,
        })?
        .flatten()
    {
        // One unparsable certificate in a system bundle should not disable the others.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(DeliveryError::NoCaCertificate(pem_path.to_string()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(DeliveryError::TlsSetup)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A socket each read and write of which ends by the delivery's deadline: its timeout is set
/// to the time left before every call, so a receiver that dribbles bytes, or a TLS handshake
/// the peer never answers (rustls reads inside its writes), holds a delivery thread no longer
/// than [`WEBHOOK_DEADLINE`].
pub(super) struct Deadlined {
    pub(super) tcp: TcpStream,
    pub(super) deadline: Instant,
}

impl Deadlined {
    fn left(&self) -> std::io::Result<Duration> {
        remaining(self.deadline).map_err(|_| std::io::Error::from(ErrorKind::TimedOut))
    }
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.tcp.set_read_timeout(Some(self.left()?))?;
        self.tcp.read(buf)
    }
}

impl Write for Deadlined {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.set_write_timeout(Some(self.left()?))?;
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

/// Writes the request and reads one answer, at most [`WEBHOOK_RESPONSE_BYTES_MAX`] bytes of it
/// (by the deadline of `stream`'s socket, [`Deadlined`]).
fn exchange<S: Read + Write>(
    mut stream: S,
    request: &[u8],
) -> Result<(u16, Vec<u8>), DeliveryError> {
    stream
        .write_all(request)
        .and_then(|()| stream.flush())
        .map_err(|e| io_error(e, DeliveryError::Send))?;
    let mut buf = Vec::with_capacity(4096);
    let mut eof = false;
    // Each round reads at least one byte, up to the cap, or ends: at most
    // WEBHOOK_RESPONSE_BYTES_MAX + 1 rounds, and the deadline ends it sooner.
    loop {
        match response::parse(&buf, eof)? {
            Parsed::Complete(answer) => return Ok((answer.status, answer.body)),
            Parsed::Partial if buf.len() >= WEBHOOK_RESPONSE_BYTES_MAX => {
                return Err(DeliveryError::AnswerTooLong)
            }
            Parsed::Partial => eof = fill(&mut stream, &mut buf)?,
        }
    }
}

/// Reads more into `buf`, never past [`WEBHOOK_RESPONSE_BYTES_MAX`]; `true` at end of stream.
fn fill<S: Read>(stream: &mut S, buf: &mut Vec<u8>) -> Result<bool, DeliveryError> {
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
        Err(e) => Err(io_error(e, DeliveryError::Receive)),
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
#[path = "delivery_tests.rs"]
mod tests;
