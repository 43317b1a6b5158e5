//! Content types with a meaning on the wire.

/// A Pico binary append batch ([`crate::batch`]); also the type of a binary read page.
pub const BATCH: &str = "application/vnd.picomq.batch";
/// A Pico JSON append batch ([`crate::json`]).
pub const BATCH_JSON: &str = "application/vnd.picomq.batch+json";
/// Bytes without a structure the server looks into; the default type of a stream.
pub const OCTET_STREAM: &str = "application/octet-stream";
/// JSON: error bodies, and Durable Streams streams whose appends are JSON values or arrays.
pub const JSON: &str = "application/json";
/// Server-sent events (`live=sse`).
pub const EVENT_STREAM: &str = "text/event-stream";
