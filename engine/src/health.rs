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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// How often a core tries again to create its next WAL file after it could not.
pub const WAL_FILE_RETRY_MS: u64 = 1000;

/// `Retry-After` of an append refused because the WAL cannot take it.
pub const WAL_RETRY_AFTER_SEC: u64 = 5;

/// A core's WAL, as its shard sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WalHealth {
    Ok,
    /// The next WAL file could not be made; `out_of_space` when the filesystem said so.
    NoNextFile {
        message: String,
        out_of_space: bool,
    },
    /// Appends stop until a restart.
    Failed {
        message: String,
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
            WalHealth::Ok => (HealthState::Ok, ""),
            WalHealth::NoNextFile { message, .. } => (HealthState::Degraded, message.as_str()),
            WalHealth::Failed { message } => (HealthState::Failed, message.as_str()),
        };
        if let Ok(mut held) = self.reason.lock() {
            reason.clone_into(&mut held);
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
        report.publish(&WalHealth::NoNextFile {
            message: "disk full".into(),
            out_of_space: true,
        });
        assert_eq!(report.state(), HealthState::Degraded);
        assert_eq!(report.reason(), "disk full");
        report.publish(&WalHealth::Ok);
        assert_eq!(
            (report.state(), report.reason()),
            (HealthState::Ok, String::new())
        );
        report.publish(&WalHealth::Failed {
            message: "EIO".into(),
        });
        assert_eq!(report.state(), HealthState::Failed);
    }
}
