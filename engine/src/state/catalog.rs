//! A fork origin as the catalog stores it, and the one place it converts to and from the
//! engine's own (its depth is derived, not stored).

use super::ForkOrigin;

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
