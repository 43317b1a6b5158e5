//! From socket bytes to one [`message::Request`] and back: the TCP and TLS streams, HTTP/1.1
//! and HTTP/2, and the request and response types both protocols share.

pub mod http1;
pub mod http2;
pub mod message;
pub mod socket;
pub mod tls;
