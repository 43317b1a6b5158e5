//! Whether a core's write-ahead log can take appends, and what appends, `/ready` and
//! `/metrics` are told when it cannot (docs/durability.md, "Storage faults").
//!
//! Two kinds of trouble, handled differently:
//! - **No next WAL file** (usually: the disk is full). Nothing written is in doubt. Appends
//!   the active file still has room for go on; others are refused (`507` when out of space)
//!   before any offset is given out. Creating the file is retried every
//!   [`WAL_FILE_RETRY_MS`], and appends resume on their own once it succeeds.
//! - **Failed**: a WAL write or `fdatasync` failed, or the WAL file was removed or replaced
//!   under the node. After a failed `fdatasync` the kernel may have dropped the dirty pages
//!   while clearing the error, so a retry that succeeds proves nothing. The appends in
//!   flight are failed, never acknowledged, and the core takes no more appends until a
//!   restart, whose recovery reads what really is on disk. Reads go on from memory and the
//!   bucket.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How often a core tries again to create its next WAL file after it could not.
pub const WAL_FILE_RETRY_MS: u64 = 1000;

/// `Retry-After` of an append refused because the WAL cannot take it.
pub const WAL_RETRY_AFTER_SEC: u64 = 5;

/// What failed in a core's WAL: the operation, the file or directory, and the filesystem's
/// answer (its kind and errno kept). Its text is what appends, `/ready` and the log report.
#[derive(Clone, Debug)]
pub enum WalFault {
    /// The next WAL file could not be created.
    Create {
        path: PathBuf,
        source: Arc<io::Error>,
    },
    /// The next WAL file could not be given its room.
    PreAllocate {
        path: PathBuf,
        source: Arc<io::Error>,
    },
    /// The next WAL file could not be written through with zeros (`WalFill`).
    WriteZeros {
        path: PathBuf,
        source: Arc<io::Error>,
    },
    /// The WAL directory could not be synced (a new file's entry would not survive a crash).
    SyncDir {
        dir: PathBuf,
        source: Arc<io::Error>,
    },
    /// The open file's name no longer exists.
    Gone {
        path: PathBuf,
        source: Arc<io::Error>,
    },
    /// The open file's name names another file.
    Replaced { path: PathBuf },
    Write {
        path: PathBuf,
        source: Arc<io::Error>,
    },
    /// Fewer bytes were written than the round holds.
    ShortWrite {
        path: PathBuf,
        written: usize,
        len: usize,
    },
    Fdatasync {
        path: PathBuf,
        source: Arc<io::Error>,
    },
    /// The core's WAL ledger (`wal_ledger.rs`, at `path`) could not be written: a new file is
    /// not handed out before the ledger lists it.
    Ledger {
        path: PathBuf,
        source: Arc<io::Error>,
    },
}

impl WalFault {
    /// Whether the next WAL file could not be made because the filesystem (or the quota) is
    /// full: making it is retried until it is not.
    pub fn out_of_space(&self) -> bool {
        match self {
            WalFault::Create { source, .. }
            | WalFault::PreAllocate { source, .. }
            | WalFault::WriteZeros { source, .. }
            | WalFault::Ledger { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
            ),
            _ => false,
        }
    }

    /// The WAL file (or, for `SyncDir`, the directory) it concerns.
    pub fn path(&self) -> &Path {
        match self {
            WalFault::Create { path, .. }
            | WalFault::PreAllocate { path, .. }
            | WalFault::WriteZeros { path, .. }
            | WalFault::SyncDir { dir: path, .. }
            | WalFault::Gone { path, .. }
            | WalFault::Replaced { path }
            | WalFault::Write { path, .. }
            | WalFault::ShortWrite { path, .. }
            | WalFault::Fdatasync { path, .. }
            | WalFault::Ledger { path, .. } => path,
        }
    }

    /// The filesystem's answer, when there was one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            WalFault::Create { source, .. }
            | WalFault::PreAllocate { source, .. }
            | WalFault::WriteZeros { source, .. }
            | WalFault::SyncDir { source, .. }
            | WalFault::Gone { source, .. }
            | WalFault::Write { source, .. }
            | WalFault::Fdatasync { source, .. }
            | WalFault::Ledger { source, .. } => Some(source),
            WalFault::Replaced { .. } | WalFault::ShortWrite { .. } => None,
        }
    }
}

impl std::fmt::Display for WalFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalFault::Create { path, source } => {
                write!(f, "cannot create WAL file {}: {source}", path.display())
            }
            WalFault::PreAllocate { path, source } => {
                write!(
                    f,
                    "cannot pre-allocate WAL file {}: {source}",
                    path.display()
                )
            }
            WalFault::WriteZeros { path, source } => {
                write!(f, "cannot write WAL file {}: {source}", path.display())
            }
            WalFault::SyncDir { dir, source } => {
                write!(f, "cannot sync WAL directory {}: {source}", dir.display())
            }
            WalFault::Gone { path, source } => write!(
                f,
                "WAL file {} is gone ({source}): it was removed while in use",
                path.display()
            ),
            WalFault::Replaced { path } => write!(
                f,
                "WAL file {} was replaced by another file while in use",
                path.display()
            ),
            WalFault::Write { path, source } => {
                write!(f, "WAL write to {}: {source}", path.display())
            }
            WalFault::ShortWrite { path, written, len } => write!(
                f,
                "WAL write to {}: {written} of {len} bytes written",
                path.display()
            ),
            WalFault::Fdatasync { path, source } => {
                write!(f, "WAL fdatasync of {}: {source}", path.display())
            }
            WalFault::Ledger { path, source } => {
                write!(f, "cannot write WAL ledger {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for WalFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.io_error()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Two faults are the same when they are the same operation on the same path with the same
/// answer (kind, errno and text): a fault met again is not logged again.
impl PartialEq for WalFault {
    fn eq(&self, other: &WalFault) -> bool {
        let same_io = match (self.io_error(), other.io_error()) {
            (Some(a), Some(b)) => {
                a.kind() == b.kind()
                    && a.raw_os_error() == b.raw_os_error()
                    && a.to_string() == b.to_string()
            }
            (None, None) => true,
            _ => false,
        };
        let same_counts = match (self, other) {
            (
                WalFault::ShortWrite { written, len, .. },
                WalFault::ShortWrite {
                    written: w, len: l, ..
                },
            ) => written == w && len == l,
            _ => true,
        };
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.path() == other.path()
            && same_io
            && same_counts
    }
}

impl Eq for WalFault {}

/// A core's WAL, as its shard sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WalHealth {
    Ok,
    /// The next WAL file could not be made (`WalFault::out_of_space` tells a full disk).
    NoNextFile {
        fault: WalFault,
    },
    /// Appends stop until a restart.
    Failed {
        fault: WalFault,
    },
}

/// What the admin listener reads of a core's WAL health (from any thread).
#[derive(Default)]
pub struct HealthReport {
    /// A [`HealthState`] as a number, for the `pico_wal_health` gauge.
    state: AtomicU64,
    reason: Mutex<String>,
}

/// A core's WAL health as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthState {
    Ok = 0,
    /// Appends the active WAL file has no room for are refused until the next file can be
    /// made (retried on its own).
    Degraded = 1,
    /// No appends until a restart.
    Failed = 2,
}

impl HealthState {
    pub fn name(self) -> &'static str {
        match self {
            HealthState::Ok => "ok",
            HealthState::Degraded => "degraded",
            HealthState::Failed => "failed",
        }
    }
}

impl HealthReport {
    pub(crate) fn publish(&self, health: &WalHealth) {
        let (state, reason) = match health {
            WalHealth::Ok => (HealthState::Ok, String::new()),
            WalHealth::NoNextFile { fault } => (HealthState::Degraded, fault.to_string()),
            WalHealth::Failed { fault } => (HealthState::Failed, fault.to_string()),
        };
        if let Ok(mut held) = self.reason.lock() {
            *held = reason;
        }
        self.state.store(state as u64, Ordering::Relaxed);
    }

    pub fn state(&self) -> HealthState {
        match self.state.load(Ordering::Relaxed) {
            0 => HealthState::Ok,
            1 => HealthState::Degraded,
            _ => HealthState::Failed,
        }
    }

    /// Why the state is not `Ok` (empty when it is).
    pub fn reason(&self) -> String {
        self.reason.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_follows_the_health_it_is_given() {
        let report = HealthReport::default();
        assert_eq!(report.state(), HealthState::Ok);
        let full = WalFault::Create {
            path: "/wal/1.wal".into(),
            source: Arc::new(io::Error::from_raw_os_error(libc::ENOSPC)),
        };
        report.publish(&WalHealth::NoNextFile {
            fault: full.clone(),
        });
        assert_eq!(report.state(), HealthState::Degraded);
        assert_eq!(report.reason(), full.to_string());
        assert!(report
            .reason()
            .starts_with("cannot create WAL file /wal/1.wal: "));
        report.publish(&WalHealth::Ok);
        assert_eq!(
            (report.state(), report.reason()),
            (HealthState::Ok, String::new())
        );
        report.publish(&WalHealth::Failed {
            fault: WalFault::Replaced {
                path: "/wal/1.wal".into(),
            },
        });
        assert_eq!(report.state(), HealthState::Failed);
        assert_eq!(
            report.reason(),
            "WAL file /wal/1.wal was replaced by another file while in use"
        );
    }
}
