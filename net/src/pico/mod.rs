//! The Pico protocol: methods and paths to engine operations, engine errors to status codes.
//!
//! The stream name is the request path exactly as received (not percent-decoded); `/` is
//! reserved for the listing. See `docs/api.md` for the user-facing description. A request
//! enters at [`handle`] (`handle.rs`), which routes it to `write.rs` or `read.rs`; live
//! reads stream from `sse.rs`, failures render through `error.rs`.

pub(crate) mod error;
mod handle;
mod read;
mod settings;
mod sse;
mod write;

pub use error::connection_error;
pub use handle::handle;
pub use settings::PicoSettings;
#[cfg(test)]
#[cfg(test)]
pub(crate) use sse::STATE_BYTES;
