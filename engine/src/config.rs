//! The engine's settings (a subset of `pico serve`'s flags), the rules they must meet (a value
//! out of range is refused at startup, never raised silently) and how they may be shown.

use std::path::PathBuf;

use crate::limits;
use crate::producers::ProducerLimits;

/// When an append is acknowledged (`--durability`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// After the local WAL's `fdatasync` (group-committed).
    #[default]
    Local,
    /// No local WAL: after the segment holding it is stored in the bucket and indexed in the
    /// catalog, so it survives the loss of the node's disk. A core flushes its active
    /// segment as soon as its uploader is free, within `object_puts_per_second`.
    Object,
    /// As soon as the owning core accepted it, without a WAL: nothing survives a crash.
    /// Benchmarks and tests only.
    Memory,
}

/// The engine's settings (a subset of `pico serve`'s flags).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub cores: usize,
    /// Directory of the WAL files (`<epoch>-<core>-<counter>.wal`).
    pub wal_dir: PathBuf,
    pub durability: Durability,
    /// A segment seals at this many bytes...
    pub segment_size: usize,
    /// ...or once its first frame is this old.
    pub segment_max_age_ms: u64,
    /// Uploaded segments kept in memory per core for reads.
    pub segment_cache_bytes: usize,
    /// Names this run's WAL files and segments; raised above any name already used.
    pub node_epoch_ms: u64,
    /// `--node-id`: segment keys go under `.../n<id>/`, so nodes sharing a catalog and bucket
    /// can never write the same key; `None` is the single-node layout.
    pub node_id: Option<u32>,
    /// The catalog's id, which segment keys go under (`placement::segment_key`): set by
    /// [`crate::boot`] from the catalog it opens; a value given here is replaced.
    pub catalog_id: Option<String>,
    /// Bytes of appends a core holds before they are durable; past it appends get `429`.
    pub in_flight_bytes_max: usize,
    /// Bytes of sealed segments a core holds before the object store took them; past it
    /// appends get `429` until uploads catch up (a slow or unreachable store).
    pub unuploaded_bytes_max: usize,
    /// How often core 0 looks for segment objects no live stream needs and deletes them.
    pub gc_interval_ms: u64,
    /// Object durability: the flush PUTs the whole node may make per second (the cost
    /// control, `put_budget.rs`).
    pub object_puts_per_second: u32,
    /// `--wal-salvage`: start past a damaged WAL file, keeping what can be read in order and
    /// closing each stream that lost records (`recovery/salvage.rs`); without it the node
    /// refuses to start on one.
    pub wal_salvage: bool,
    /// How many idempotent producers a stream and the node keep, and when an idle one is
    /// forgotten (`producers.rs`).
    pub producers: ProducerLimits,
}

impl EngineConfig {
    /// The engine's rules for its settings, checked by [`crate::boot`]: `Err` says which
    /// value is out of range and what it must be (the server checks its flags with these too).
    pub fn check(&self) -> Result<(), limits::SettingError> {
        limits::at_least("cores (--cores)", self.cores as u64, 1)?;
        limits::at_least(
            "segment_max_age_ms (--segment-max-age-ms)",
            self.segment_max_age_ms,
            limits::SEGMENT_MAX_AGE_MS_MIN,
        )?;
        limits::at_least(
            "gc_interval_ms (--gc-interval-ms)",
            self.gc_interval_ms,
            limits::GC_INTERVAL_MS_MIN,
        )?;
        limits::within(
            "object_puts_per_second (--object-puts-per-second)",
            u64::from(self.object_puts_per_second),
            u64::from(limits::OBJECT_PUTS_PER_SECOND_MIN),
            u64::from(limits::OBJECT_PUTS_PER_SECOND_MAX),
        )
    }
}

/// `--meta-url` as it may be shown (logs, the admin API): a Postgres password is masked.
pub fn displayed_meta_url(url: &str) -> String {
    match pico_meta::MetaUrl::parse(url) {
        Ok(parsed) => parsed.to_string(),
        // Unparsable URLs never get this far (boot refuses them); show nothing of them.
        Err(_) => "(invalid --meta-url)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> EngineConfig {
        EngineConfig {
            cores: 1,
            wal_dir: PathBuf::from("wal"),
            durability: Durability::Local,
            segment_size: limits::SEGMENT_BYTES_MIN,
            segment_max_age_ms: limits::SEGMENT_MAX_AGE_MS_MIN,
            segment_cache_bytes: 0,
            node_epoch_ms: 1,
            node_id: None,
            catalog_id: None,
            in_flight_bytes_max: limits::IN_FLIGHT_BYTES_PER_CORE_DEFAULT,
            unuploaded_bytes_max: limits::UNUPLOADED_BYTES_PER_CORE_DEFAULT,
            gc_interval_ms: limits::GC_INTERVAL_MS_MIN,
            object_puts_per_second: limits::OBJECT_PUTS_PER_SECOND_MIN,
            wal_salvage: false,
            producers: ProducerLimits::default(),
        }
    }

    #[test]
    fn values_at_their_floor_pass_and_below_it_are_refused_not_raised() {
        assert_eq!(valid().check(), Ok(()));
        let no_cores = EngineConfig {
            cores: 0,
            ..valid()
        };
        assert_eq!(
            no_cores.check().unwrap_err().to_string(),
            "cores (--cores) must be at least 1, got 0"
        );
        let fast_gc = EngineConfig {
            gc_interval_ms: limits::GC_INTERVAL_MS_MIN - 1,
            ..valid()
        };
        assert_eq!(
            fast_gc.check().unwrap_err().to_string(),
            format!(
                "gc_interval_ms (--gc-interval-ms) must be at least {}, got {}",
                limits::GC_INTERVAL_MS_MIN,
                limits::GC_INTERVAL_MS_MIN - 1
            )
        );
        let young = EngineConfig {
            segment_max_age_ms: limits::SEGMENT_MAX_AGE_MS_MIN - 1,
            ..valid()
        };
        assert!(young
            .check()
            .unwrap_err()
            .to_string()
            .starts_with("segment_max_age_ms (--segment-max-age-ms"));
        let no_puts = EngineConfig {
            object_puts_per_second: 0,
            ..valid()
        };
        assert_eq!(
            no_puts.check().unwrap_err().to_string(),
            "object_puts_per_second (--object-puts-per-second) must be between 1 and 3500, got 0"
        );
        let many_puts = EngineConfig {
            object_puts_per_second: limits::OBJECT_PUTS_PER_SECOND_MAX + 1,
            ..valid()
        };
        assert!(many_puts.check().is_err());
    }
}
