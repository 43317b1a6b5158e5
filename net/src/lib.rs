//! PicoMQ network layer: one HTTP/1.1 reactor per core, the Pico protocol, the admin listener.

pub mod admin;
mod admin_cluster;
mod admin_state;
pub mod auth;
pub mod codec;
pub mod config;
pub mod dashboard;
pub mod ds;
pub mod ds_subs;
#[cfg(test)]
mod fuzzing;
pub mod http1;
pub mod http2;
pub mod limits;
pub mod message;
pub mod metrics;
pub mod panics;
pub mod params;
pub mod pico;
pub mod routing;
pub mod server;
pub mod shutdown;
pub mod socket;
pub mod sse;
pub mod time;
pub mod tls;

pub use config::{Durability, Protocol, ServerConfig};
pub use server::run;
