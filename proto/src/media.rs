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

/// The lowercased type without its parameters, as content types are compared
/// (`Application/JSON; charset=utf-8` is `application/json`).
pub fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    #[test]
    fn essence_drops_parameters_and_case() {
        assert_eq!(
            super::essence(" Application/JSON ; charset=utf-8"),
            "application/json"
        );
        assert_eq!(super::essence(""), "");
    }
}
