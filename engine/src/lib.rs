//! The PicoMQ storage engine: the stream state machine, record frames, one shard per core
//! with its write-ahead log and group commit, sealed segments handed to the object store, and
//! recovery.
//!
//! A node starts in `boot` (which runs `recovery` and builds each stream's `seeds`), then one
//! `CoreHandle` per core (`handle`) serves the protocol layers: it routes each operation to
//! the stream's owning core (`placement`, `route`, over the `inbox` between cores), where the
//! `shard` runs it; `fork` stitches forks across cores and `gc` collects unused segments.

pub mod api;
mod boot;
pub mod cluster;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod fork;
pub mod frame;
mod gc;
mod handle;
pub mod health;
mod inbox;
pub mod limits;
pub mod metrics;
mod notify;
mod placement;
mod recovery;
mod route;
mod seeds;
mod shard;
pub mod state;

use std::path::PathBuf;

pub use api::{
    AppendAck, AppendRequest, CreateRequest, Created, Fork, ForkSpec, Op, ReadBatch, ReadBound,
    ReadFrom, ReadRequest, RecordInput, RecordView, Reply, RetentionChange, StreamInfo,
    StreamSummary,
};
pub use boot::{boot, Boot, CoreSeed};
pub use cluster::{Cluster, ClusterConfig};
pub use error::EngineError;
pub use handle::CoreHandle;
/// The metadata types the layers above see (cluster state, URLs).
pub use pico_meta as meta;
pub use placement::owner_core;
pub use state::{ForkOrigin, StreamConfig};

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

/// Wall-clock Unix milliseconds: the one clock of record timestamps and expiry.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
