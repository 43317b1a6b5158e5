//! TLS for the listeners (`--tls-cert`, `--tls-key`): rustls with the ring provider, ALPN
//! `h2` and `http/1.1`.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN protocol ids, most preferred first.
pub const ALPN_H2: &[u8] = b"h2";
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Loads the certificate chain and private key (PEM) into a server configuration; every error
/// names the file and what is wrong with it.
pub fn server_config(
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| format!("cannot read --tls-cert {}: {e}", cert_path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| {
            format!(
                "--tls-cert {} is not a PEM certificate chain: {e}",
                cert_path.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "--tls-cert {} holds no certificate",
            cert_path.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
        format!(
            "--tls-key {} holds no usable PEM private key: {e}",
            key_path.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("--tls-cert/--tls-key do not form a usable pair: {e}"))?;
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}
