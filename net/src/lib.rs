//! PicoMQ network layer: one HTTP/1.1 reactor per core, the Pico protocol, the admin listener.

pub mod config;

pub use config::{run, Durability, Protocol, ServerConfig};
