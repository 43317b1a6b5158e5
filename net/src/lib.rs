//! PicoMQ network layer: one HTTP/1.1 and HTTP/2 reactor per core, the Pico and Durable Streams
//! protocols, the admin listener. Read in request order: `server` (process set-up, listeners)
//! -> `transport` (bytes to a `transport::message::Request`) -> `pico` / `ds` (a request to
//! engine calls) -> back out as a `Response`. docs/architecture.md draws the whole path.

mod admin;
mod auth;
mod backup;
pub mod codec;
mod config;
mod consumers;
mod crossing;
mod ds;
#[cfg(test)]
mod fuzzing;
mod limits;
mod live_response;
mod panics;
mod params;
mod pico;
mod routing;
mod server;
mod shutdown;
mod subscriptions;
mod time;
mod transport;

pub use auth::{LineProblem, TokenFileError, TokenLineError};
pub use backup::{restore, BackupError, FileAction, RestoreSummary, RestoreTarget};
pub use config::{
    BuildInfo, ConfigError, Durability, Protocol, ServerConfig, DS_LISTEN_PORT_DEFAULT,
};
pub use limits::{BACKUP_TIMEOUT_SEC_DEFAULT, BODY_BYTES_MAX_DEFAULT, VERIFY_TIMEOUT_SEC_DEFAULT};
pub use panics::install_hook as install_panic_hook;
pub use server::{check, run, CoreStartError, StartError};
pub use transport::tls::TlsError;
