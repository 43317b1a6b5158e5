//! How a backup's checkpoint ([`crate::CoreHandle::checkpoint`]) fails: a core could not be
//! asked, or did not store and commit what it held in time.

use crate::error::EngineError;

/// Why a checkpoint did not finish; the WAL of each core named still holds what it did not
/// store.
#[derive(Debug)]
pub enum CheckpointError {
    /// The request could not be queued to `core` (its inbox is full, or it is stopping).
    Ask { core: usize, source: EngineError },
    /// These cores did not finish within the timeout.
    Late { cores: Vec<usize>, timeout_ms: u128 },
}

impl std::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointError::Ask { core, source } => write!(f, "core {core}: {source}"),
            CheckpointError::Late { cores, timeout_ms } => write!(
                f,
                "cores {cores:?} did not store and commit what they hold within {timeout_ms} ms \
                 (an object store or catalog outage, or a failed WAL)"
            ),
        }
    }
}

impl std::error::Error for CheckpointError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckpointError::Ask { source, .. } => Some(source),
            CheckpointError::Late { .. } => None,
        }
    }
}
