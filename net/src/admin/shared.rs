//! What the admin listener's handlers share: the node state they report and the JSON answer
//! shapes. Both `mod.rs` (one node) and `cluster.rs` (the cluster's view) build on it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use pico_engine::metrics::NodeMetrics;
use pico_engine::CoreHandle;
use serde_json::{json, Value};

use crate::admin::metrics::HttpMetrics;
use crate::auth::CoreTokens;
use crate::transport::message::Response;

/// What the node tells about itself.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub advertised_address: String,
    pub node_epoch_ms: u64,
    pub cores: usize,
    pub durability: &'static str,
    pub storage: String,
    /// Shown with any password masked.
    pub meta_url: String,
    /// Damaged WAL files `--wal-salvage` started the node past, each with what was lost.
    pub wal_salvaged: Vec<String>,
    /// Recovered WAL files the bucket has not taken yet (served from memory meanwhile).
    pub recovery_backlog: Arc<pico_engine::RecoveryBacklog>,
    pub build: crate::config::BuildInfo,
    /// `--backup-dir`: where backups go.
    pub backup_dir: std::path::PathBuf,
    /// Where the node keeps its files, for the disk usage it reports.
    pub disk: crate::admin::usage::DiskPaths,
}

/// Node state the admin listener reports.
pub struct AdminState {
    /// All cores started and listening; false again as soon as shutdown begins, so load
    /// balancers stop sending traffic during the drain window.
    pub serving: Arc<AtomicBool>,
    pub core: Rc<CoreHandle>,
    pub engine_metrics: NodeMetrics,
    pub http_metrics: Vec<Arc<HttpMetrics>>,
    pub started: Instant,
    pub facts: NodeFacts,
    /// Placement weight of this node (`POST /admin/nodes/{id}`); meaningful with clusters.
    pub slots: Cell<u64>,
    pub tokens: Option<Rc<CoreTokens>>,
    /// The node's Durable Streams subscriptions, whose state a backup copies.
    pub subscriptions: Option<Arc<crate::subscriptions::Subscriptions>>,
    /// The latest backup (one runs at a time).
    pub backup: Rc<BackupStatus>,
    /// The latest verify of the stored objects (one runs at a time).
    pub verify: crate::admin::verify::VerifyStatus,
    /// The collector's hold an operator took (`POST /admin/gc-hold`).
    pub gc_holds: ManualHolds,
    /// The last storage measurement (`usage.rs` refreshes it).
    pub usage: Cell<crate::admin::usage::StorageUsage>,
}

/// The node's latest backup, as `GET /admin/backup` tells it (`backup.rs` runs them).
#[derive(Default)]
pub struct BackupStatus(pub(super) RefCell<Option<Value>>);

/// A hold an operator took, released at `until_ms` unless released or renewed first
/// (`gc_hold.rs`).
pub struct ManualHold {
    pub(super) _hold: pico_engine::GcHold,
    pub(super) until_ms: i64,
    /// Which `POST` set it: the timer of an earlier one leaves a renewed hold alone.
    pub(super) generation: u64,
}

/// The node's manual hold, if one is taken, and the number of the last `POST`.
#[derive(Default)]
pub struct ManualHolds {
    pub(super) current: RefCell<Option<ManualHold>>,
    pub(super) generations: Cell<u64>,
}

pub(crate) fn json_response(status: u16, body: Value) -> Response {
    Response::new(status)
        .header("content-type", pico_proto::media::JSON)
        .header("cache-control", "no-store")
        .with_body(body.to_string())
}

pub(crate) fn error(status: u16, message: impl Into<String>) -> Response {
    json_response(status, json!({ "error": message.into() }))
}

/// A stream's retention policy for the admin API: each limit, `null` when off.
pub(crate) fn retention_json(retention: &pico_meta::Retention) -> Value {
    json!({
        "ageSeconds": retention.age_ms.map(|ms| ms / 1000),
        "bytes": retention.bytes,
        "deleteOnEmptySeconds": retention.delete_on_empty_ms.map(|ms| ms / 1000),
    })
}

/// A job's bounds from its request body (`POST /admin/backup`, `POST /admin/verify`):
/// `timeoutSec` from 1 to `timeout_max_sec` (absent: `timeout_default_sec`), and an optional
/// positive `maxBytesPerSecond`; a `400` naming the field otherwise.
pub(crate) fn job_bounds(
    body: &Value,
    timeout_default_sec: u64,
    timeout_max_sec: u64,
) -> Result<(std::time::Duration, Option<u64>), Response> {
    let timeout_sec = match body.get("timeoutSec") {
        None | Some(Value::Null) => timeout_default_sec,
        Some(value) => match value.as_u64() {
            Some(n) if (1..=timeout_max_sec).contains(&n) => n,
            _ => {
                return Err(error(
                    400,
                    format!("\"timeoutSec\" must be an integer from 1 to {timeout_max_sec}"),
                ))
            }
        },
    };
    let max_bytes_per_second = match body.get("maxBytesPerSecond") {
        None | Some(Value::Null) => None,
        Some(value) => match value.as_u64() {
            Some(n) if n > 0 => Some(n),
            _ => {
                return Err(error(
                    400,
                    "\"maxBytesPerSecond\" must be a positive integer",
                ))
            }
        },
    };
    Ok((
        std::time::Duration::from_secs(timeout_sec),
        max_bytes_per_second,
    ))
}
