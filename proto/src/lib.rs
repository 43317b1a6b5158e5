//! The wire formats of PicoMQ, written once.
//!
//! The server (`pico-net`), the client library (`pico-client`) and the load generator
//! (`pico-bench`) all speak these formats from this one copy, so they cannot disagree (one
//! ignoring bytes after a batch, another refusing them). Everything a peer on the other end of
//! a socket must agree on lives here, next to its drawing:
//!
//! - [`batch`]: the Pico binary append batch (`application/vnd.picomq.batch`);
//! - [`page`]: the Pico binary read page (`GET ...?format=binary`);
//! - [`json`]: the Pico JSON append batch and the JSON read page;
//! - [`media`]: content types; [`header`]: header names of both protocols;
//! - [`offset`]: the Durable Streams offset text; [`error_body`]: the error bodies of both.
//!
//! The contract is `docs/api.md` (Pico) and `docs/durable-streams.md`. Decoders never panic,
//! never trust a length or count before the bytes are there, and hand out slices of the input
//! instead of copies. Both binary decoders read exactly the records the count announces and
//! **ignore bytes after the last one**: that is the Pico protocol's rule since 0.1, which
//! clients written for it rely on; a count that is too small is the sender's bug, and the
//! answer's `Pico-Start-Seq`/`Pico-Next-Seq` say how many records were taken.

pub mod batch;
pub mod error_body;
pub mod header;
pub mod json;
pub mod media;
pub mod offset;
pub mod page;
mod reader;

pub use batch::Record;
pub use page::PageRecord;

/// The two protocols a node speaks over one engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// PicoMQ's native protocol (`Pico-*` headers, `docs/api.md`).
    #[default]
    Pico,
    /// The open Durable Streams protocol (`Stream-*`/`Producer-*`, `docs/durable-streams.md`).
    DurableStreams,
}

impl Protocol {
    /// The name `--protocol` takes.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Pico => "pico",
            Protocol::DurableStreams => "ds",
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Protocol, String> {
        match s.to_ascii_lowercase().as_str() {
            "pico" => Ok(Protocol::Pico),
            "ds" => Ok(Protocol::DurableStreams),
            _ => Err(format!("unknown protocol {s:?}: expected pico or ds")),
        }
    }
}

/// Why a binary batch or page could not be decoded. The texts are the protocol's 400 messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Nothing at all: not even a version byte.
    Empty,
    UnknownVersion(u8),
    /// The input ended inside the named field.
    Truncated(&'static str),
    /// A header name or value is not UTF-8.
    InvalidUtf8,
    /// The count announces more records than the caller accepts.
    TooManyRecords {
        max: usize,
    },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Empty => f.write_str("truncated batch"),
            DecodeError::UnknownVersion(v) => write!(f, "unknown batch version {v}"),
            DecodeError::Truncated(_) => f.write_str("truncated payload"),
            DecodeError::InvalidUtf8 => f.write_str("invalid UTF-8 in headers"),
            DecodeError::TooManyRecords { max } => write!(f, "at most {max} records per append"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A length or count that does not fit the format's `u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge(pub &'static str);

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} does not fit in 32 bits", self.0)
    }
}

impl std::error::Error for TooLarge {}
