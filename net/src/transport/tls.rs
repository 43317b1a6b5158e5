//! TLS for the listeners (`--tls-cert`, `--tls-key`): rustls with the ring provider, ALPN
//! `h2` and `http/1.1`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN protocol ids, most preferred first.
pub const ALPN_H2: &[u8] = b"h2";
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Why the TLS set-up failed; each names the file and what is wrong with it.
#[derive(Debug)]
pub enum TlsError {
    /// `--tls-cert` could not be read.
    ReadCert {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    /// `--tls-cert` is not a PEM certificate chain.
    CertNotPem {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    /// `--tls-cert` holds no certificate.
    NoCert { path: PathBuf },
    /// `--tls-key` holds no usable PEM private key.
    Key {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    /// rustls refused the protocol versions.
    Setup(rustls::Error),
    /// The certificate and the key do not form a usable pair.
    Pair(rustls::Error),
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsError::ReadCert { path, source } => {
                write!(f, "cannot read --tls-cert {}: {source}", path.display())
            }
            TlsError::CertNotPem { path, source } => write!(
                f,
                "--tls-cert {} is not a PEM certificate chain: {source}",
                path.display()
            ),
            TlsError::NoCert { path } => {
                write!(f, "--tls-cert {} holds no certificate", path.display())
            }
            TlsError::Key { path, source } => write!(
                f,
                "--tls-key {} holds no usable PEM private key: {source}",
                path.display()
            ),
            TlsError::Setup(e) => write!(f, "TLS setup: {e}"),
            TlsError::Pair(e) => write!(f, "--tls-cert/--tls-key do not form a usable pair: {e}"),
        }
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsError::ReadCert { source, .. }
            | TlsError::CertNotPem { source, .. }
            | TlsError::Key { source, .. } => Some(source),
            TlsError::NoCert { .. } => None,
            TlsError::Setup(e) | TlsError::Pair(e) => Some(e),
        }
    }
}

/// Loads the certificate chain and private key (PEM) into a server configuration; every error
/// names the file and what is wrong with it.
pub fn server_config(
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert = || cert_path.to_path_buf();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(|source| TlsError::ReadCert {
            path: cert(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::CertNotPem {
            path: cert(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCert { path: cert() });
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|source| TlsError::Key {
        path: key_path.to_path_buf(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::Pair)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}
