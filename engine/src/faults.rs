//! Faults injected into a core's WAL I/O and its compactor's steps, so the engine's error
//! paths run in fast in-process tests (`engine/tests/wal_faults.rs`, `engine/tests/compaction.rs`). Compiled only with the
//! `fault-injection` feature, which only the engine's own tests turn on.
//!
//! A fault is armed for one WAL directory (so tests running side by side do not meet each
//! other's) and fires once, at the next I/O of its kind there.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where in the WAL's I/O a fault fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalIo {
    /// Creating and pre-allocating a WAL file.
    Create,
    /// Writing a commit round's bytes.
    Write,
    /// The `fdatasync` after the write.
    Sync,
    /// A write of a core's WAL ledger (`wal_ledger.rs`).
    Ledger,
}

static ARMED: Mutex<Vec<(PathBuf, WalIo, i32)>> = Mutex::new(Vec::new());

/// Makes the next `io` in `wal_dir` fail with `errno` (e.g. `libc::EIO`, `libc::ENOSPC`).
pub fn arm(wal_dir: &Path, io: WalIo, errno: i32) {
    if let Ok(mut armed) = ARMED.lock() {
        armed.push((wal_dir.to_path_buf(), io, errno));
    }
}

/// The armed fault for `io` in `wal_dir`, taken (it fires once).
pub(crate) fn take(wal_dir: &Path, io: WalIo) -> Option<std::io::Error> {
    let mut armed = ARMED.lock().ok()?;
    let at = armed
        .iter()
        .position(|(dir, kind, _)| dir == wal_dir && *kind == io)?;
    let (_, _, errno) = armed.remove(at);
    Some(std::io::Error::from_raw_os_error(errno))
}

/// Takes back one armed fault for `io` in `wal_dir`; `false` when none was left.
pub fn disarm(wal_dir: &Path, io: WalIo) -> bool {
    take(wal_dir, io).is_some()
}

/// Where a core's compactor (`shard/compact.rs`) stops as if the process died there, or fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactStep {
    /// The merged object's PUT fails (nothing stored, nothing swapped).
    FailPut,
    /// After the PUT, before the catalog swap: the compactor stops for good (as the process
    /// would), the node serves on.
    AfterPut,
    /// The swap commits, and its answer is lost (the compactor asks again).
    LoseSwapAnswer,
    /// After the swap committed, before the core's chunks move to the merged object: the
    /// compactor stops for good, as for `AfterPut`.
    AfterSwap,
}

static COMPACT_ARMED: Mutex<Vec<(PathBuf, CompactStep)>> = Mutex::new(Vec::new());
static RETIRE_GRACE: Mutex<Vec<(PathBuf, u64)>> = Mutex::new(Vec::new());

/// Makes the next compaction of the node with this WAL directory stop at `step` (once).
pub fn arm_compact(wal_dir: &Path, step: CompactStep) {
    if let Ok(mut armed) = COMPACT_ARMED.lock() {
        armed.push((wal_dir.to_path_buf(), step));
    }
}

/// Whether a compaction in `wal_dir` stops at `step` now (the fault is used up).
pub(crate) fn take_compact(wal_dir: &Path, step: CompactStep) -> bool {
    let Ok(mut armed) = COMPACT_ARMED.lock() else {
        return false;
    };
    match armed
        .iter()
        .position(|(dir, s)| dir == wal_dir && *s == step)
    {
        Some(at) => {
            armed.remove(at);
            true
        }
        None => false,
    }
}

/// Whether a fault for `step` in `wal_dir` is still armed (the compactor did not reach it).
pub fn compact_armed(wal_dir: &Path, step: CompactStep) -> bool {
    COMPACT_ARMED
        .lock()
        .is_ok_and(|armed| armed.iter().any(|(dir, s)| dir == wal_dir && *s == step))
}

/// Retired objects of the node with this WAL directory are kept `ms` instead of
/// `limits::COMPACT_RETIRE_GRACE_MS` (so a test sees the collector delete them).
pub fn set_retire_grace_ms(wal_dir: &Path, ms: u64) {
    if let Ok(mut grace) = RETIRE_GRACE.lock() {
        grace.retain(|(dir, _)| dir != wal_dir);
        grace.push((wal_dir.to_path_buf(), ms));
    }
}

pub(crate) fn retire_grace_ms(wal_dir: &Path) -> Option<u64> {
    let grace = RETIRE_GRACE.lock().ok()?;
    grace
        .iter()
        .find(|(dir, _)| dir == wal_dir)
        .map(|(_, ms)| *ms)
}
