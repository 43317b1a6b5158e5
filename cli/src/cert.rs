//! `pico cert`: a local certificate authority and a server certificate it signed, for TLS in
//! development. A self-signed certificate made the usual way (`openssl req -x509`) is marked
//! as a CA, which the client's verifier (webpki) refuses as a server's certificate; a CA plus
//! a certificate it signed is what every client accepts, so that is what this makes.
//!
//! Files in `--dir`: `ca.pem` (give it to clients: `pico --ca-cert`, `curl --cacert`),
//! `ca-key.pem`, `cert.pem` and `key.pem` (`pico serve --tls-cert --tls-key`). Keys are ECDSA
//! P-256, written readable by the owner only. Existing files are never overwritten.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::args::CertArgs;
use crate::Failure;

/// The files, in the order they are written.
const FILES: [&str; 4] = ["ca.pem", "ca-key.pem", "cert.pem", "key.pem"];
/// Clocks of the machines involved may differ by this much.
const BACKDATE_SEC: u64 = 3600;
const DAY_SEC: u64 = 86_400;

pub fn run(args: &CertArgs) -> Result<(), Failure> {
    let hosts: Vec<String> = args
        .host
        .iter()
        .flat_map(|h| h.split(','))
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    let hosts = if hosts.is_empty() {
        vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
    } else {
        hosts
    };
    if args.days == 0 || args.days > 3650 {
        return Err(Failure::Usage(
            "--days must be between 1 and 3650".to_owned(),
        ));
    }
    let paths: Vec<PathBuf> = FILES.iter().map(|f| args.dir.join(f)).collect();
    if let Some(existing) = paths.iter().find(|p| p.exists()) {
        return Err(Failure::Fatal(format!(
            "{} exists: remove the old files or choose another --dir",
            existing.display()
        )));
    }
    let pems = make(&hosts, args.days).map_err(Failure::Fatal)?;
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| Failure::Fatal(format!("cannot create {}: {e}", args.dir.display())))?;
    for (path, (pem, secret)) in paths.iter().zip(pems) {
        write_new(path, pem.as_bytes(), secret)?;
    }
    let [ca, _, cert, key] = &paths[..] else {
        unreachable!("four files")
    };
    eprintln!(
        "wrote a local CA and a certificate for {}",
        hosts.join(", ")
    );
    eprintln!(
        "  pico serve --tls-cert {} --tls-key {} ...",
        show(cert),
        show(key)
    );
    eprintln!(
        "  pico --ca-cert {} --endpoint https://{}:4437 ...  (curl --cacert {})",
        show(ca),
        url_host(&hosts[0]),
        show(ca)
    );
    Ok(())
}

/// The PEMs of the four files, each with whether it is secret.
fn make(hosts: &[String], days: u32) -> Result<[(String, bool); 4], String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| "the system clock is before 1970".to_owned())?;
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let not_before = epoch + now.saturating_sub(Duration::from_secs(BACKDATE_SEC));
    let not_after = epoch + now + Duration::from_secs(u64::from(days) * DAY_SEC);
    fn failed(what: &'static str) -> impl Fn(rcgen::Error) -> String {
        move |e| format!("cannot make the {what}: {e}")
    }

    let ca_key = KeyPair::generate().map_err(failed("CA key"))?;
    let mut ca = CertificateParams::default();
    // A name of its own: a client finds a certificate's issuer by name, and with two CAs of
    // one name it would report a bad signature instead of an unknown CA.
    let name = format!("pico development CA {:x}", now.as_nanos());
    ca.distinguished_name.push(DnType::CommonName, name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(failed("CA certificate"))?;
    let issuer = Issuer::new(ca, &ca_key);

    let key = KeyPair::generate().map_err(failed("server key"))?;
    let mut leaf = CertificateParams::new(hosts.to_vec())
        .map_err(|e| format!("invalid --host (a DNS name or an IP address): {e}"))?;
    leaf.distinguished_name.push(DnType::CommonName, &hosts[0]);
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let cert = leaf
        .signed_by(&key, &issuer)
        .map_err(failed("server certificate"))?;
    Ok([
        (ca_cert.pem(), false),
        (ca_key.serialize_pem(), true),
        (cert.pem(), false),
        (key.serialize_pem(), true),
    ])
}

/// Creates `path` (never replacing a file); secrets are readable by the owner only.
fn write_new(path: &Path, data: &[u8], secret: bool) -> Result<(), Failure> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options
        .open(path)
        .and_then(|mut file| file.write_all(data).and_then(|()| file.sync_all()))
        .map_err(|e| Failure::Fatal(format!("cannot write {}: {e}", path.display())))
}

fn show(path: &Path) -> String {
    path.display().to_string()
}

/// An IPv6 address needs brackets in a URL.
fn url_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}
