//! Why a node did not start or stopped serving ([`StartError`]): each message is one line for
//! the operator, naming the flag, file or address to fix (`pico serve` prints it and exits).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::auth::TokenFileError;
use crate::config::ConfigError;
use crate::transport::tls::TlsError;

/// Why `run` returned before the node served, or why serving could not go on.
#[derive(Debug)]
pub enum StartError {
    /// A flag out of range.
    Config(ConfigError),
    /// The stop signals could not be blocked.
    BlockSignals,
    /// The thread that takes a second stop signal could not start.
    SignalThread(std::io::Error),
    /// The locked-memory limit is below what io_uring needs.
    Memlock { limit_kib: u64, needed_kib: u64 },
    /// `--auth-tokens` could not be read or parsed.
    Tokens(TokenFileError),
    /// `--auth-tokens` holds no grant.
    NoGrants { path: PathBuf },
    /// `--auth required` without `--auth-tokens`.
    TokensNeeded,
    /// A listener beyond loopback without authentication.
    OpenRemote { addr: String },
    /// A listen address that does not resolve.
    Resolve {
        addr: String,
        source: std::io::Error,
    },
    /// Two of the node's listen addresses on one port.
    ListenersOverlap {
        first: (&'static str, SocketAddr),
        second: (&'static str, SocketAddr),
    },
    /// Another socket already listens where a listener would.
    PortTaken {
        addr: SocketAddr,
        holder: SocketAddr,
    },
    /// `--tls-cert`/`--tls-key` unusable.
    Tls(TlsError),
    /// Only one of `--tls-cert` and `--tls-key`.
    TlsHalf,
    /// The engine did not boot (settings, WAL directory, metadata, object store, recovery).
    Boot(pico_engine::BootError),
    /// The subscription state could not be loaded (its store's message).
    Subscriptions(crate::subscriptions::StoreError),
    /// A core's executor could not start.
    Executor(glommio::GlommioError<()>),
    /// A core did not report within the start timeout.
    CoreTimeout { core: usize },
    /// A core started but could not serve.
    Core(CoreStartError),
    /// The node's addresses could not be published to the cluster.
    Advertise(pico_engine::AdvertiseError),
}

/// Why one core could not start serving (sent from its thread).
#[derive(Debug)]
pub enum CoreStartError {
    /// The engine's shard for the core did not start.
    Engine(pico_engine::StartError),
    /// Another socket already listens where a listener would.
    PortTaken {
        addr: SocketAddr,
        holder: SocketAddr,
    },
    /// A listener could not be bound.
    Bind {
        addr: SocketAddr,
        source: glommio::GlommioError<()>,
    },
    /// A bound listener's address could not be read.
    LocalAddr(glommio::GlommioError<()>),
}

impl std::fmt::Display for CoreStartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CoreStartError::Engine(e) => e.fmt(f),
            CoreStartError::Bind { addr, source } => write!(
                f,
                "cannot listen on {addr}: {source} (is another server using it? pick another \
                 with --listen, --ds-listen (or --ds-listen off) or --admin-listen)"
            ),
            CoreStartError::PortTaken { addr, holder } => port_taken(f, *addr, *holder),
            CoreStartError::LocalAddr(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CoreStartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CoreStartError::Engine(e) => Some(e),
            CoreStartError::PortTaken { .. } => None,
            CoreStartError::Bind { source, .. } | CoreStartError::LocalAddr(source) => Some(source),
        }
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => e.fmt(f),
            StartError::BlockSignals => f.write_str("cannot block shutdown signals"),
            StartError::SignalThread(e) => write!(f, "cannot start the signal thread: {e}"),
            StartError::Memlock {
                limit_kib,
                needed_kib,
            } => write!(
                f,
                "locked-memory limit is {limit_kib} KiB but io_uring needs at least {needed_kib} \
                 KiB: run `ulimit -l 8192` (or set LimitMEMLOCK= in systemd, --ulimit memlock= \
                 in Docker)"
            ),
            StartError::Tokens(e) => e.fmt(f),
            StartError::NoGrants { path } => write!(
                f,
                "--auth-tokens {}: no grants, so every request would be refused: add lines \
                 `token prefix permissions` (docs/security.md)",
                path.display()
            ),
            StartError::TokensNeeded => f.write_str("--auth required needs --auth-tokens FILE"),
            StartError::OpenRemote { addr } => write!(
                f,
                "refusing to listen on {addr} without authentication: use --auth required \
                 --auth-tokens FILE, or --insecure-allow-remote to expose it anyway"
            ),
            StartError::Resolve { addr, source } => {
                write!(f, "cannot resolve listen address {addr}: {source}")
            }
            StartError::ListenersOverlap {
                first: (first_flag, first),
                second: (second_flag, second),
            } => write!(
                f,
                "{first_flag} {first} and {second_flag} {second} are one port: its connections \
                 would be split between the two listeners; give each a port of its own"
            ),
            StartError::PortTaken { addr, holder } => port_taken(f, *addr, *holder),
            StartError::Tls(e) => e.fmt(f),
            StartError::TlsHalf => f.write_str("--tls-cert and --tls-key go together"),
            StartError::Boot(e) => e.fmt(f),
            StartError::Subscriptions(e) => write!(f, "{e}"),
            StartError::Executor(e) => {
                let error = e.to_string();
                if error.contains("io_uring")
                    || error.contains("Operation not permitted")
                    || error.contains("ENOSYS")
                {
                    write!(
                        f,
                        "cannot start an io_uring executor: {error}. io_uring may be disabled \
                         (kernel < 5.8, sysctl kernel.io_uring_disabled, or a container seccomp \
                         profile blocking io_uring_setup)"
                    )
                } else {
                    write!(f, "cannot start an executor: {error}")
                }
            }
            StartError::CoreTimeout { core } => {
                write!(f, "core {core} did not start within 30 s")
            }
            StartError::Core(e) => e.fmt(f),
            StartError::Advertise(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Config(e) => Some(e),
            StartError::SignalThread(e) | StartError::Resolve { source: e, .. } => Some(e),
            StartError::Tokens(e) => Some(e),
            StartError::Tls(e) => Some(e),
            StartError::Boot(e) => Some(e),
            StartError::Executor(e) => Some(e),
            StartError::Core(e) => Some(e),
            StartError::Advertise(e) => Some(e),
            _ => None,
        }
    }
}

macro_rules! from {
    ($($source:ty => $variant:ident),* $(,)?) => {
        $(impl From<$source> for StartError {
            fn from(e: $source) -> StartError {
                StartError::$variant(e)
            }
        })*
    };
}

from! {
    ConfigError => Config,
    TokenFileError => Tokens,
    TlsError => Tls,
    pico_engine::BootError => Boot,
    CoreStartError => Core,
    pico_engine::AdvertiseError => Advertise,
}

/// Refused rather than shared: the kernel would let both listen and give each process a part
/// of the port's connections (`SO_REUSEPORT`).
fn port_taken(
    f: &mut std::fmt::Formatter<'_>,
    addr: SocketAddr,
    holder: SocketAddr,
) -> std::fmt::Result {
    write!(
        f,
        "cannot listen on {addr}: another socket already listens on {holder} (`ss -ltnp \
         'sport = :{port}'` names its process); sharing the port would give each server a part \
         of its connections, so stop the other server or pick another port with --listen, \
         --ds-listen (or --ds-listen off) or --admin-listen",
        port = addr.port()
    )
}
