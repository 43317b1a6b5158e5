//! The Durable Streams protocol (`Stream-*` / `Producer-*` headers) on the same engine as the
//! Pico protocol: a stream created through either protocol is readable and writable through
//! both, as both name a stream by its request path.
//!
//! Mapping onto engine records:
//! - a POST body is one record; in JSON mode (`application/json`) a top-level array is
//!   flattened one level and every element is one record (a message);
//! - a read of a JSON stream is `[` + the records joined by `,` + `]`; of any other stream the
//!   records' bodies concatenated.
//!
//! Offsets are opaque to clients and sort lexicographically in stream order:
//!
//! ```text
//! 0000000000000042_0000000000000000
//! └── record seq ─┘ └─ bytes into ─┘   both 16 decimal digits; the second part is
//!                      that record       non-zero only inside a record (a fork point)
//! ```
//!
//! so `0000000000000000_0000000000000000` is the beginning of every stream, `-1` too, and
//! `now` the tail.
//!
//! A request enters at [`handle`] (`handle.rs`), which routes it to `write.rs` or `read.rs`
//! (live reads: `sse.rs`; bodies: `encode.rs`); failures render through `error.rs`, and
//! `params.rs` holds what they all share. Webhook and pull-wake subscriptions are
//! `subscriptions/`.

mod encode;
mod error;
mod handle;
mod params;
mod read;
mod sse;
#[cfg(test)]
mod tests;
mod write;

pub use error::connection_error;
pub use handle::handle;
#[cfg(test)]
pub(crate) use params::format_offset;
pub use params::DsSettings;
#[cfg(test)]
#[cfg(test)]
pub(crate) use sse::STATE_BYTES;
