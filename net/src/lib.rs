//! PicoMQ network layer: one HTTP/1.1 and HTTP/2 reactor per core, the Pico and Durable Streams
//! protocols, the admin listener. Read in request order: `server` (process set-up, listeners)
//! -> `transport` (bytes to [`transport::message::Request`]) -> `pico` / `ds` (a request to
//! engine calls) -> back out as a `Response`. docs/architecture.md draws the whole path.

pub mod admin;
pub mod auth;
pub mod backup;
pub mod codec;
pub mod config;
pub mod consumers;
pub mod crossing;
pub mod ds;
#[cfg(test)]
mod fuzzing;
pub mod limits;
mod live;
pub mod panics;
pub mod params;
pub mod pico;
pub mod routing;
pub mod server;
pub mod shutdown;
pub mod subscriptions;
pub mod time;
pub mod transport;

pub use config::{Durability, Protocol, ServerConfig};
pub use server::run;
