//! Making certificates the `pico` client accepts (docs/tls.md): the documented openssl recipe
//! run as written, `pico cert`, and the advice the client gives when it refuses one (the
//! usual self-signed CA:TRUE certificate, an untrusted CA, a name the certificate lacks).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::Server;

/// The shell block of docs/tls.md that follows the comment naming this file.
fn documented_recipe() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/tls.md");
    let doc = std::fs::read_to_string(&path).expect("read docs/tls.md");
    let after = doc
        .split_once("cli/tests/tls_setup.rs runs this block")
        .expect("docs/tls.md marks the tested recipe")
        .1;
    let block = after
        .split_once("```sh\n")
        .expect("a sh block after the marker")
        .1;
    block
        .split_once("\n```\n")
        .expect("the end of the block")
        .0
        .to_owned()
}

/// `pico ARGS` against `server` over https, trusting `ca`.
fn pico_tls(server: &Server, ca: &Path, args: &[&str]) -> Output {
    let endpoint = format!("https://{}", server.addr);
    let ca = ca.display().to_string();
    let mut all = vec!["--endpoint", endpoint.as_str(), "--ca-cert", ca.as_str()];
    all.extend_from_slice(args);
    common::pico(server.dir(), &all)
}

/// A round trip through a TLS node made with `cert` and `key`, trusting `ca`.
#[track_caller]
fn serves_over_tls(cert: &Path, key: &Path, ca: &Path) {
    let server = Server::start(&[
        "--cores",
        "1",
        "--tls-cert",
        &cert.display().to_string(),
        "--tls-key",
        &key.display().to_string(),
    ]);
    for (args, stdout) in [
        (&["create", "/tls"][..], ""),
        (&["head", "/tls"], "start=0 next=0 closed=false"),
        (&["read", "/tls"], ""),
    ] {
        let out = pico_tls(&server, ca, args);
        assert!(
            out.status.success(),
            "pico {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).starts_with(stdout));
    }
}

/// The client's error for a node serving `cert` and `key`, trusting `ca`.
fn refusal(cert: &Path, key: &Path, ca: &Path) -> String {
    let server = Server::start(&[
        "--cores",
        "1",
        "--tls-cert",
        &cert.display().to_string(),
        "--tls-key",
        &key.display().to_string(),
    ]);
    let out = pico_tls(&server, ca, &["read", "/s"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the openssl tool");
    assert!(status.success(), "openssl {args:?}");
}

fn pico_cert(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["cert", "--dir", "certs"];
    all.extend_from_slice(args);
    common::pico(dir, &all)
}

#[test]
fn the_documented_openssl_recipe_makes_a_certificate_the_client_accepts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("recipe.sh"), documented_recipe()).unwrap();
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "recipe.sh"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "the recipe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = |name: &str| dir.path().join(name);
    serves_over_tls(&file("cert.pem"), &file("key.pem"), &file("ca.pem"));
}

#[test]
fn pico_cert_makes_a_ca_and_a_certificate_the_client_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = pico_cert(
        dir.path(),
        &["--host", "localhost,127.0.0.1", "--days", "2"],
    );
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--tls-cert certs/cert.pem"), "{stderr}");
    let file = |name: &str| dir.path().join("certs").join(name);
    for key in ["ca-key.pem", "key.pem"] {
        let mode = std::fs::metadata(file(key)).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{key} is readable by its owner only");
    }
    serves_over_tls(&file("cert.pem"), &file("key.pem"), &file("ca.pem"));
    // openssl agrees: the certificate chains to the CA and is no CA itself.
    openssl(
        &dir.path().join("certs"),
        &[
            "verify",
            "-CAfile",
            "ca.pem",
            "-purpose",
            "sslserver",
            "cert.pem",
        ],
    );
    // Existing files are never replaced.
    let again = pico_cert(dir.path(), &[]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("ca.pem exists"),
        "{again:?}"
    );
    let bad = pico_cert(dir.path(), &["--dir", "other", "--days", "0"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}

#[test]
fn a_refused_certificate_comes_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The usual self-signed certificate: CA:TRUE, which webpki refuses as a server's own.
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            "self-key.pem",
            "-out",
            "self.pem",
        ],
    );
    let self_signed = d.join("self.pem");
    let stderr = refusal(&self_signed, &d.join("self-key.pem"), &self_signed);
    assert!(
        stderr.contains("the server's certificate is a CA certificate")
            && stderr.contains("pico cert"),
        "{stderr}"
    );

    // Another CA than the one that signed the certificate.
    assert!(pico_cert(d, &["--host", "127.0.0.1"]).status.success());
    let other = tempfile::tempdir().unwrap();
    assert!(pico_cert(other.path(), &[]).status.success());
    let certs = d.join("certs");
    let stderr = refusal(
        &certs.join("cert.pem"),
        &certs.join("key.pem"),
        &other.path().join("certs/ca.pem"),
    );
    assert!(
        stderr.contains("not signed by a CA this client trusts") && stderr.contains("--ca-cert"),
        "{stderr}"
    );

    // A certificate for other names than the endpoint's host.
    let named = tempfile::tempdir().unwrap();
    assert!(pico_cert(named.path(), &["--host", "example.test"])
        .status
        .success());
    let certs = named.path().join("certs");
    let stderr = refusal(
        &certs.join("cert.pem"),
        &certs.join("key.pem"),
        &certs.join("ca.pem"),
    );
    assert!(
        stderr.contains("does not name the endpoint's host"),
        "{stderr}"
    );
}
