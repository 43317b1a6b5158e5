//! The engine's settings (a subset of `pico serve`'s flags) and how they may be shown.

use std::path::PathBuf;

/// When an append is acknowledged (`--durability`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// After the local WAL's `fdatasync` (group-committed).
    #[default]
    Local,
    /// No local WAL: after the segment holding it is stored in the bucket and indexed in the
    /// catalog, so it survives the loss of the node's disk (segments seal every
    /// `segment_max_age_ms`, the object flush interval).
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
    /// `--node-id`: segment keys go under `segments/n<id>/`, so nodes sharing a bucket can
    /// never write the same key; `None` keeps the single-node layout `segments/<name>`.
    pub node_id: Option<u32>,
    /// Bytes of appends a core holds before they are durable; past it appends get `429`.
    pub in_flight_bytes_max: usize,
    /// Bytes of sealed segments a core holds before the object store took them; past it
    /// appends get `429` until uploads catch up (a slow or unreachable store).
    pub unuploaded_bytes_max: usize,
    /// How often core 0 looks for segment objects no live stream needs and deletes them.
    pub gc_interval_ms: u64,
}

/// `--meta-url` as it may be shown (logs, the admin API): a Postgres password is masked.
pub fn displayed_meta_url(url: &str) -> String {
    match pico_meta::MetaUrl::parse(url) {
        Ok(parsed) => parsed.to_string(),
        // Unparsable URLs never get this far (boot refuses them); show nothing of them.
        Err(_) => "(invalid --meta-url)".to_string(),
    }
}
