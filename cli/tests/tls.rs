//! HTTPS on the protocol and admin listeners (`--tls-cert`, `--tls-key`): ALPN picks h2 or
//! HTTP/1.1, the client's `--ca-cert` trusts a private CA, and bad key material stops the
//! server at startup with a message naming the file.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::Server;

/// A private CA and a server certificate it signed for 127.0.0.1 and localhost, made with the
/// openssl tool (webpki refuses a self-signed CA used directly as the server's certificate).
/// Returns (server certificate, server key, CA certificate) paths.
fn make_certificate(dir: &Path) -> (String, String, String) {
    let path = |name: &str| dir.join(name).display().to_string();
    let ext = dir.join("leaf.ext");
    std::fs::write(
        &ext,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let steps: [Vec<String>; 3] = [
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=pico-test-ca",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["-addext".into(), "basicConstraints=critical,CA:TRUE".into()])
        .chain(["-addext".into(), "keyUsage=critical,keyCertSign".into()])
        .chain([
            "-keyout".into(),
            path("ca.key"),
            "-out".into(),
            path("ca.pem"),
        ])
        .collect(),
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "-keyout".into(),
            path("key.pem"),
            "-out".into(),
            path("leaf.csr"),
        ])
        .collect(),
        ["x509", "-req", "-days", "2", "-CAcreateserial"]
            .iter()
            .map(|s| s.to_string())
            .chain(["-in".into(), path("leaf.csr"), "-CA".into(), path("ca.pem")])
            .chain([
                "-CAkey".into(),
                path("ca.key"),
                "-out".into(),
                path("cert.pem"),
            ])
            .chain(["-extfile".into(), ext.display().to_string()])
            .collect(),
    ];
    for step in steps {
        let status = Command::new("openssl")
            .args(&step)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("the openssl tool makes the test certificates");
        assert!(status.success(), "openssl {step:?} failed");
    }
    (path("cert.pem"), path("key.pem"), path("ca.pem"))
}

fn client(ca_pem: &[u8], http1_only: bool) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = reqwest::Certificate::from_pem_bundle(ca_pem).unwrap();
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .tls_certs_merge(certs);
    if http1_only {
        builder = builder.http1_only();
    }
    builder.build().unwrap()
}

#[test]
fn https_with_alpn_on_both_listeners() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, ca_path) = make_certificate(certs.path());
    let server = Server::start(&["--tls-cert", &cert, "--tls-key", &key]);
    let ca = std::fs::read(&ca_path).unwrap();
    let base = format!("https://{}", server.addr);
    let admin = format!("https://{}", server.admin);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let h2 = client(&ca, false);
            let created = h2.put(format!("{base}/tls/a")).send().await.unwrap();
            assert_eq!(created.version(), reqwest::Version::HTTP_2, "ALPN h2");
            assert_eq!(created.status(), 201);
            let h1 = client(&ca, true);
            let appended = h1
                .post(format!("{base}/tls/a"))
                .body("secret")
                .send()
                .await
                .unwrap();
            assert_eq!(
                appended.version(),
                reqwest::Version::HTTP_11,
                "ALPN http/1.1"
            );
            assert_eq!(appended.status(), 200);
            let read = h2
                .get(format!("{base}/tls/a?format=raw"))
                .send()
                .await
                .unwrap();
            assert_eq!(read.bytes().await.unwrap().as_ref(), b"secret");
            let ready = h2.get(format!("{admin}/ready")).send().await.unwrap();
            assert_eq!(ready.status(), 200);
            // A client that does not trust the certificate is refused by its own TLS check.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let untrusting = reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap();
            assert!(untrusting
                .get(format!("{base}/tls/a"))
                .send()
                .await
                .is_err());
        });

    // The pico client with --ca-cert over https.
    let output = common::pico(
        certs.path(),
        &["--endpoint", &base, "--ca-cert", &ca_path, "read", "/tls/a"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "0\tsecret\n");
}

#[test]
fn bad_tls_files_stop_the_server_with_a_clear_message() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, _) = make_certificate(certs.path());
    let data = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["--tls-cert", "/nonexistent/cert.pem", "--tls-key", &key],
            "cannot read --tls-cert /nonexistent/cert.pem",
        ),
        (
            &["--tls-cert", &key, "--tls-key", &key],
            "holds no certificate",
        ),
        (
            &["--tls-cert", &cert],
            "--tls-cert and --tls-key go together",
        ),
    ];
    for (flags, expected) in cases {
        let listeners = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ];
        let args: Vec<&str> = listeners.iter().chain(flags.iter()).copied().collect();
        let output = common::pico(data.path(), &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(
            stderr.contains("pico: ") && stderr.contains(expected),
            "{flags:?}: {stderr}"
        );
    }
}

/// The open HTTP connections of `admin`'s node (`pico_http_connections`, all cores; the
/// request asking counts itself).
async fn open_connections(client: &reqwest::Client, admin: &str) -> u64 {
    let page = client
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    page.lines()
        .filter(|line| line.starts_with("pico_http_connections{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A reader over TLS that stops reading is closed after `--send-stall-timeout-sec` like any
/// other: rustls writes its records through the socket's own timed writes.
#[test]
fn a_tls_reader_that_never_reads_is_closed_after_the_send_stall_timeout() {
    use rustls::pki_types::pem::PemObject;
    use std::io::{Read, Write};

    let certs = tempfile::tempdir().unwrap();
    let (cert, key, ca_path) = make_certificate(certs.path());
    let server = Server::start(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--protocol",
        "ds",
        "--cores",
        "1",
        "--catch-up-read-size",
        "16MiB",
        "--send-stall-timeout-sec",
        "2",
    ]);
    let ca = std::fs::read(&ca_path).unwrap();
    let base = format!("https://{}", server.addr);
    let admin = format!("https://{}", server.admin);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Its own client: dropped after, so its pooled connection does not stay counted.
        let http = client(&ca, true);
        let octets = ("content-type", "application/octet-stream");
        let created = http.put(format!("{base}/big")).header(octets.0, octets.1);
        assert_eq!(created.send().await.unwrap().status(), 201);
        let record = vec![b'r'; 64 << 10];
        for _ in 0..256 {
            let append = http.post(format!("{base}/big")).header(octets.0, octets.1);
            let appended = append.body(record.clone()).send().await.unwrap();
            assert_eq!(appended.status(), 204);
        }
    });
    // A TLS client asks for 16 MiB and reads only the answer's head.
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(der.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let socket = std::net::TcpStream::connect(server.addr).unwrap();
    common::small_receive_buffer(&socket);
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(connection, socket);
    tls.write_all(b"GET /big?offset=-1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 12];
    tls.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    // It reads no more: the connection is closed after the stall timeout, not held (only the
    // metrics request's own connection is left).
    let http = client(&ca, true);
    runtime.block_on(async {
        for _ in 0..600 {
            if open_connections(&http, &admin).await <= 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the stalled TLS connection is still open after a minute");
    });
    drop(tls);
}

/// A machine without a system CA store (no `ca-certificates`): the client still reaches a
/// plain node and a TLS node whose CA it is given, and says what is missing for any other
/// `https://` endpoint (rather than failing every command with "cannot build the HTTP
/// client").
#[test]
fn a_machine_without_system_certificates_still_reaches_plain_and_private_ca_nodes() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, ca_path) = make_certificate(certs.path());
    let tls = Server::start(&["--tls-cert", &cert, "--tls-key", &key]);
    let plain = Server::start(&[]);
    let empty = tempfile::tempdir().unwrap();
    let pico = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_pico"))
            .args(args)
            .current_dir(certs.path())
            .env_clear()
            .env("SSL_CERT_FILE", empty.path().join("none.pem"))
            .env("SSL_CERT_DIR", empty.path())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run pico")
    };
    let plain_url = format!("http://{}", plain.addr);
    let created = pico(&["--endpoint", &plain_url, "create", "/plain"]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let tls_url = format!("https://{}", tls.addr);
    let created = pico(&[
        "--endpoint",
        &tls_url,
        "--ca-cert",
        &ca_path,
        "create",
        "/private",
    ]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let refused = pico(&["--endpoint", &tls_url, "head", "/private"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("ca-certificates") && stderr.contains("--ca-cert"),
        "{stderr}"
    );
}
