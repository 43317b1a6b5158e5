//! From socket bytes to one [`message::Request`] and back: the TCP and TLS streams, HTTP/1.1
//! and HTTP/2, the request and response types both protocols share, and the one driver of
//! live responses (`drive.rs`) of which each transport writes only the bytes.

pub(crate) mod drive;
pub mod http1;
pub mod http2;
pub mod message;
mod readiness;
pub mod socket;
pub mod tls;
