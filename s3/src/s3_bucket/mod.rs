//! The `s3://` backend: S3 REST calls signed with SigV4 (`sigv4.rs`), sent with reqwest on the
//! upload thread's tokio runtime.
//!
//! Every call retries transient failures (connection errors, timeouts, 5xx, 429, 503 SlowDown)
//! with exponential backoff and full jitter, within a bounded number of attempts and a total
//! deadline. Permanent answers (403, 404, other 4xx) are never retried. Retrying a put is safe:
//! keys are written once with fixed contents (same key, same bytes), and a PUT replaces the
//! whole object atomically, so a retried PUT cannot duplicate or tear data.
//!
//! Files: `config` (the options and where the bucket is), `call` (one request and its answer),
//! `client` (sending a call: signing, timeouts, retries, explaining failures), `objects` (the
//! object operations: put, get, list, delete) and `multipart` (big puts in parts).

mod call;
mod client;
mod config;
mod multipart;
mod objects;

pub(crate) use client::S3Bucket;
pub(crate) use config::S3Config;
pub use config::S3Options;
pub(crate) use objects::ProbeError;

#[cfg(test)]
mod tests;
