//! Webhook delivery: one plain thread (`pico-webhooks`) POSTs signed wake notifications with a
//! small blocking HTTP/1.1 client, so no core ever blocks on a receiver. Every POST is bounded
//! (connect, I/O and total timeouts; response size), the queue is bounded, and results go back
//! into the registry, which schedules bounded retries.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;

use super::registry::{Clock, Effect, Job, Outcome};
use super::shared::Shared;
use super::webhook_url::{self, Host, WebhookUrl};
use crate::limits::{
    WEBHOOK_CONNECT_TIMEOUT, WEBHOOK_DEADLINE, WEBHOOK_IO_TIMEOUT, WEBHOOK_RESPONSE_BODY_BYTES_MAX,
    WEBHOOK_RESPONSE_HEAD_BYTES_MAX,
};

/// The thread's loop: until the sending side (the `Subscriptions`) is dropped.
pub fn run(shared: Arc<Shared>, jobs: Receiver<Job>) {
    let mut tls: Option<Result<Arc<rustls::ClientConfig>, String>> = None;
    // A `done` reply can start the next wake at once; it is delivered from here rather than
    // through the bounded channel, which only the cores feed.
    let mut local: VecDeque<Job> = VecDeque::new();
    loop {
        let job = match local.pop_front() {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let outcome = deliver(&shared, &job, &mut tls);
        let acked = outcome == Outcome::Done;
        let effects = shared.write().delivery_result(&job, outcome, Clock::now());
        if acked {
            // A synchronous `done` acks: written now rather than by the next sweep. On failure
            // the sweeper retries it.
            if let Err(e) = shared.persist() {
                log::error!("subscriptions: {e}");
            }
        }
        for effect in effects {
            match effect {
                Effect::Deliver(next) => local.push_back(next),
                // Only pull-wake subscriptions append, and they never deliver.
                Effect::AppendWake { stream, .. } => {
                    log::error!("webhook thread cannot append a wake event to {stream}")
                }
            }
        }
    }
}

fn deliver(
    shared: &Shared,
    job: &Job,
    tls: &mut Option<Result<Arc<rustls::ClientConfig>, String>>,
) -> Outcome {
    let signature = shared
        .signing
        .signature_header(job.body.as_bytes(), unix_secs());
    let result = webhook_url::parse(&job.url).and_then(|url| {
        let tls = if url.https {
            Some(tls.get_or_insert_with(client_config).clone()?)
        } else {
            None
        };
        post(&url, job.body.as_bytes(), &signature, tls)
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

/// Connects to the first address of the URL's host that its policy allows.
fn connect(url: &WebhookUrl) -> Result<TcpStream, String> {
    let candidates: Vec<SocketAddr> = match &url.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, url.port)],
        Host::Name(name) => (name.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {name}: {e}"))?
            .collect(),
    };
    let allowed: Vec<SocketAddr> = candidates
        .into_iter()
        .filter(|addr| webhook_url::address_allowed(url, addr.ip()))
        .collect();
    if allowed.is_empty() {
        return Err("the host has no address deliveries may go to".into());
    }
    let mut last = String::new();
    for addr in allowed {
        match TcpStream::connect_timeout(&addr, WEBHOOK_CONNECT_TIMEOUT) {
            Ok(stream) => {
                stream
                    .set_read_timeout(Some(WEBHOOK_IO_TIMEOUT))
                    .and_then(|()| stream.set_write_timeout(Some(WEBHOOK_IO_TIMEOUT)))
                    .map_err(|e| e.to_string())?;
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(last)
}

/// POSTs `body` and returns the status and (bounded) response body.
pub fn post(
    url: &WebhookUrl,
    body: &[u8],
    signature: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<(u16, Vec<u8>), String> {
    let deadline = Instant::now() + WEBHOOK_DEADLINE;
    let tcp = connect(url)?;
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

/// Writes the request and reads one response (Content-Length, chunked, or until close).
fn exchange<S: Read + Write>(
    mut stream: S,
    request: &[u8],
    deadline: Instant,
) -> Result<(u16, Vec<u8>), String> {
    stream
        .write_all(request)
        .and_then(|()| stream.flush())
        .map_err(|e| format!("sending: {e}"))?;
    let mut buf = Vec::with_capacity(4096);
    let mut eof = false;
    // The head; interim 1xx responses are skipped.
    let (status, framing, head_len) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = response.code.unwrap_or(0);
                if (100..200).contains(&status) {
                    buf.drain(..len);
                    continue;
                }
                break (status, Framing::of(response.headers)?, len);
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(format!("bad response: {e}")),
        }
        if buf.len() > WEBHOOK_RESPONSE_HEAD_BYTES_MAX {
            return Err("response head too large".into());
        }
        if eof {
            return Err("connection closed before a response".into());
        }
        eof = fill(&mut stream, &mut buf, deadline)?;
    };
    buf.drain(..head_len);
    let body = match framing {
        Framing::Length(len) => {
            let want = len.min(WEBHOOK_RESPONSE_BODY_BYTES_MAX);
            while buf.len() < want && !eof {
                eof = fill(&mut stream, &mut buf, deadline)?;
            }
            buf.truncate(want);
            buf
        }
        Framing::UntilClose => {
            while !eof && buf.len() < WEBHOOK_RESPONSE_BODY_BYTES_MAX {
                eof = fill(&mut stream, &mut buf, deadline)?;
            }
            buf.truncate(WEBHOOK_RESPONSE_BODY_BYTES_MAX);
            buf
        }
        Framing::Chunked => {
            let mut body = Vec::new();
            loop {
                match decode_chunks(&buf, &mut body) {
                    Some(Ok(())) => break,
                    Some(Err(e)) => return Err(e),
                    None if eof || body.len() > WEBHOOK_RESPONSE_BODY_BYTES_MAX => break,
                    None => eof = fill(&mut stream, &mut buf, deadline)?,
                }
                body.clear();
            }
            body.truncate(WEBHOOK_RESPONSE_BODY_BYTES_MAX);
            body
        }
    };
    Ok((status, body))
}

/// Reads more into `buf`; `true` at end of stream.
fn fill<S: Read>(stream: &mut S, buf: &mut Vec<u8>, deadline: Instant) -> Result<bool, String> {
    if Instant::now() >= deadline {
        return Err("the receiver took too long".into());
    }
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk) {
        Ok(0) => Ok(true),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(false)
        }
        // A TLS peer that closes without close_notify: the body ends there.
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(true),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Err("the receiver did not answer in time".into())
        }
        Err(e) => Err(format!("receiving: {e}")),
    }
}

enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

impl Framing {
    fn of(headers: &[httparse::Header<'_>]) -> Result<Framing, String> {
        for h in headers {
            if h.name.eq_ignore_ascii_case("transfer-encoding")
                && std::str::from_utf8(h.value)
                    .is_ok_and(|v| v.to_ascii_lowercase().contains("chunked"))
            {
                return Ok(Framing::Chunked);
            }
        }
        for h in headers {
            if h.name.eq_ignore_ascii_case("content-length") {
                return std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .map(Framing::Length)
                    .ok_or_else(|| "bad Content-Length".to_string());
            }
        }
        Ok(Framing::UntilClose)
    }
}

/// Decodes a chunked body from `buf` into `out`: `Some(Ok)` once the last chunk is in, `None`
/// while more bytes are needed.
fn decode_chunks(buf: &[u8], out: &mut Vec<u8>) -> Option<Result<(), String>> {
    let mut at = 0;
    loop {
        let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&buf[at..line_end]).ok();
        let size = line
            .and_then(|l| l.split(';').next())
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let Some(size) = size else {
            return Some(Err("bad chunk size".into()));
        };
        at = line_end + 2;
        if size == 0 {
            return Some(Ok(()));
        }
        if buf.len() < at + size + 2 {
            return None;
        }
        out.extend_from_slice(&buf[at..at + size]);
        at += size + 2;
        if out.len() > WEBHOOK_RESPONSE_BODY_BYTES_MAX {
            return Some(Ok(()));
        }
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
    .filter(|ip| webhook_url::address_allowed(url, *ip))
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
            let request = crate::ds::subscriptions::tests::read_http_request(&mut conn);
            conn.write_all(response).unwrap();
            request
        });
        (url, handle)
    }

    #[test]
    fn posts_signed_json_and_reads_content_length_replies() {
        let (url, handle) =
            receiver(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"done\":true}");
        let parsed = webhook_url::check(&url).unwrap();
        let (status, body) = post(&parsed, b"{\"a\":1}", "t=1,kid=k,ed25519=s", None).unwrap();
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
        let parsed = webhook_url::check(&url).unwrap();
        let (status, body) = post(&parsed, b"{}", "sig", None).unwrap();
        assert_eq!((status, body.as_slice()), (202, &b"{\"done\":true}"[..]));
        handle.join().unwrap();
        let (url, handle) = receiver(b"HTTP/1.1 500 Oops\r\n\r\nbroken");
        let parsed = webhook_url::check(&url).unwrap();
        assert_eq!(
            post(&parsed, b"{}", "sig", None).unwrap(),
            (500, b"broken".to_vec())
        );
        handle.join().unwrap();
    }

    #[test]
    fn refused_connections_and_slow_receivers_fail() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = webhook_url::check(&format!("http://127.0.0.1:{port}/")).unwrap();
        assert!(post(&url, b"{}", "sig", None).is_err());
        // Past the deadline, the exchange stops before waiting on a silent receiver.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let err = exchange(stream, b"x", Instant::now()).unwrap_err();
        assert!(err.contains("too long"), "{err}");
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
        let url = webhook_url::check(&format!(
            "https://127.0.0.1:{}/hook",
            listener.local_addr().unwrap().port()
        ))
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
        let (status, body) = post(&url, b"{}", "sig", Some(trusted)).unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"{\"done\":true}"[..]));
        // A client without the private CA refuses the receiver's certificate.
        let other = client_config_from(&dir.path().join("cert.pem").display().to_string()).unwrap();
        let err = post(&url, b"{}", "sig", Some(other)).unwrap_err();
        assert!(
            err.contains("sending") || err.contains("receiving"),
            "{err}"
        );
        handle.join().unwrap();
        assert!(client_config_from("/nonexistent.pem").is_err());
    }

    #[test]
    fn localhost_resolves_only_to_loopback() {
        let url = webhook_url::check("http://localhost:9/").unwrap();
        assert!(allowed_ips(&url).iter().all(|ip| ip.is_loopback()));
    }
}
