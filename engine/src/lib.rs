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
pub mod bucket_check;
mod checkpoint;
mod clock;
mod cluster;
mod config;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod fork;
pub mod frame;
mod gc;
mod handle;
pub mod health;
mod inbox;
pub mod json;
pub mod limits;
mod live;
pub mod metrics;
mod notify;
mod ops;
mod placement;
pub mod producers;
mod put_budget;
pub mod quarantine;
mod recovery;
mod route;
pub mod rules;
mod shard;
pub mod wal_file;
mod wal_ledger;
pub mod wal_witness;

pub use api::{
    AppendAck, AppendRequest, CreateRequest, Created, ForkSpec, ReadBatch, ReadBound, ReadFrom,
    ReadRequest, RecordInput, RecordView, RetentionChange, StreamInfo, StreamSummary,
};
pub use boot::{boot, boot_with_clock, Boot, BootError, CoreSeed};
pub use checkpoint::CheckpointError;
pub use clock::{now_ms, Clock};
pub use cluster::{AdvertiseError, Cluster, ClusterConfig};
pub use config::{displayed_meta_url, Durability, EngineConfig};
pub use error::{
    AppendError, CreateError, EngineError, InvalidAppend, InvalidCreate, Mismatch, NotOwnerReason,
    ReadError, Resume, StartError, StorageFault, TrimError,
};
pub use gc::{GcHold, HoldError};
pub use handle::{CoreHandle, WriteObserver};
pub use live::ReadShape;
/// The metadata types the layers above see (cluster state, URLs).
pub use pico_meta as meta;
pub use placement::owner_core;
pub use recovery::{RecoveryBacklog, RecoveryError, StorageError};
pub use rules::{ForkOrigin, StreamConfig};
