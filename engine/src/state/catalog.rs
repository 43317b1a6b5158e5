//! A stream's configuration and fork origin as the catalog stores them, and the one place
//! each converts to and from the engine's own.

use super::{ForkOrigin, StreamConfig};

/// The catalog's row holds the configuration and, beside it, whether the stream is closed
/// (lifecycle state the engine keeps in [`super::StreamState`], not in the configuration).
impl From<pico_meta::StreamConfig> for StreamConfig {
    fn from(row: pico_meta::StreamConfig) -> StreamConfig {
        StreamConfig {
            content_type: row.content_type,
            ttl_sec: row.ttl_sec,
            expires_at_ms: row.expires_at_ms,
            retention: row.retention,
        }
    }
}

impl StreamConfig {
    /// The catalog row's configuration of a stream with this configuration, `closed` or not.
    pub fn to_row(&self, closed: bool) -> pico_meta::StreamConfig {
        pico_meta::StreamConfig {
            content_type: self.content_type.clone(),
            ttl_sec: self.ttl_sec,
            expires_at_ms: self.expires_at_ms,
            closed,
            retention: self.retention,
        }
    }
}

/// What the catalog stores of a fork (its depth is derived when the catalog is loaded).
impl From<&ForkOrigin> for pico_meta::ForkRow {
    fn from(origin: &ForkOrigin) -> pico_meta::ForkRow {
        pico_meta::ForkRow {
            source: origin.source.clone(),
            source_id: origin.source_id,
            offset: origin.offset,
            partial_bytes: origin.partial_bytes,
        }
    }
}

impl ForkOrigin {
    /// A fork as the catalog stores it, `depth` forks from a stream that is no fork.
    pub fn from_row(row: pico_meta::ForkRow, depth: u32) -> ForkOrigin {
        ForkOrigin {
            source: row.source,
            source_id: row.source_id,
            offset: row.offset,
            partial_bytes: row.partial_bytes,
            depth,
        }
    }
}
