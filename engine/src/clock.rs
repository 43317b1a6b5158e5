//! The one clock of record timestamps and expiry.

/// Wall-clock Unix milliseconds: the one clock of record timestamps and expiry.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
