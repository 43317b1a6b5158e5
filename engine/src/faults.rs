//! Faults injected into a core's WAL I/O, so the engine's error paths run in fast
//! in-process tests (`engine/tests/wal_faults.rs`). Compiled only with the
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
