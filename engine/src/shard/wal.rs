//! WAL files: their names, creation (pre-allocated, written through with zeros for a writer
//! that fills segments by size, directory entry durable), removal and
//! identity checks, and changes of the WAL's health (whether appends may go to it, see
//! `crate::health`), logged and published here and held by the journal.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::DmaFile;

use crate::config::Durability;
use crate::error::AppendError;
use crate::health::WalHealth;
use crate::placement::segment_key;

use super::journal::WalFile;
use super::state::Shard;

/// How a new WAL file's blocks are made ready.
///
/// A pre-allocated file's extents are *unwritten* (ext4, XFS): the first write to each block
/// converts it, so a commit round's DMA write cannot complete in io_uring's submitting call
/// (it is handed to a kernel worker thread), and its `fdatasync` also writes the changed
/// extent map. Written through with zeros once, a file takes every round as a plain
/// overwrite: one device write and one cache flush. That costs the file's size in writes, so
/// only a writer that fills segments by size gets it (at most doubling the bytes it writes);
/// a slow writer's segments seal by age long before they fill, and its files are only
/// reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WalFill {
    /// Blocks reserved only (`fallocate`).
    Allocated,
    /// Blocks reserved, then written with zeros and made durable.
    Written,
}

/// Bytes of zeros one write of [`WalFill::Written`] puts down.
const ZERO_WRITE_BYTES: usize = 1 << 20;

/// Why a WAL file could not be made.
pub(super) struct WalFileError {
    pub(super) message: String,
    /// The filesystem is full (or the quota is): retried until it is not.
    pub(super) out_of_space: bool,
}

impl WalFileError {
    /// `what` failed with `e`.
    pub(super) fn new(what: String, e: std::io::Error) -> WalFileError {
        let out_of_space = matches!(
            e.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        );
        WalFileError {
            message: format!("{what}: {e}"),
            out_of_space,
        }
    }
}

/// Why a WAL write round failed; the WAL fails with it (appends stop until a restart).
#[derive(Debug)]
pub(super) enum WalIoError {
    /// The open file's name no longer exists.
    Gone {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The name now names another file.
    Replaced { path: PathBuf },
    SyncDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Fewer bytes were written than the round holds.
    ShortWrite {
        path: PathBuf,
        written: usize,
        len: usize,
    },
    Fdatasync {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for WalIoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalIoError::Gone { path, source } => write!(
                f,
                "WAL file {} is gone ({source}): it was removed while in use",
                path.display()
            ),
            WalIoError::Replaced { path } => write!(
                f,
                "WAL file {} was replaced by another file while in use",
                path.display()
            ),
            WalIoError::SyncDir { dir, source } => {
                write!(f, "cannot sync WAL directory {}: {source}", dir.display())
            }
            WalIoError::Write { path, source } => {
                write!(f, "WAL write to {}: {source}", path.display())
            }
            WalIoError::ShortWrite { path, written, len } => write!(
                f,
                "WAL write to {}: {written} of {len} bytes written",
                path.display()
            ),
            WalIoError::Fdatasync { path, source } => {
                write!(f, "WAL fdatasync of {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for WalIoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WalIoError::Gone { source, .. }
            | WalIoError::SyncDir { source, .. }
            | WalIoError::Write { source, .. }
            | WalIoError::Fdatasync { source, .. } => Some(source),
            WalIoError::Replaced { .. } | WalIoError::ShortWrite { .. } => None,
        }
    }
}

/// Writes `size` bytes of zeros over `file` from its start, then makes them durable.
async fn write_zeros(file: &DmaFile, size: u64) -> std::io::Result<()> {
    let align = file.alignment() as usize;
    let mut at = 0u64;
    while at < size {
        let len = ((size - at).min(ZERO_WRITE_BYTES as u64) as usize).div_ceil(align) * align;
        let mut zeros = file.alloc_dma_buffer(len);
        zeros.as_bytes_mut().fill(0);
        let written = file.write_at(zeros, at).await?;
        if written < len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write of zeros: {written} of {len} bytes at {at}"),
            ));
        }
        at += len as u64;
    }
    file.fdatasync().await.map_err(Into::into)
}

impl Shard {
    pub(super) fn wal_path(&self, counter: u64) -> (PathBuf, String) {
        let stem = format!(
            "{:016}-{:03}-{:010}",
            self.config.node_epoch_ms, self.core, counter
        );
        (
            self.config.wal_dir.join(format!("{stem}.wal")),
            segment_key(self.config.node_id, &stem),
        )
    }

    /// Creates the next WAL file (pre-allocated, written through with zeros when `fill` says
    /// so, and with its directory entry durable).
    pub(super) async fn create_wal_file(
        &self,
        fill: WalFill,
    ) -> Result<Option<WalFile>, WalFileError> {
        let counter = self.journal.next_counter();
        if !self.wal_enabled() {
            return Ok(None);
        }
        let (path, _) = self.wal_path(counter);
        let cannot_create = |e: std::io::Error| {
            WalFileError::new(format!("cannot create WAL file {}", path.display()), e)
        };
        #[cfg(feature = "fault-injection")]
        if let Some(e) = crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Create) {
            return Err(cannot_create(e));
        }
        let file = DmaFile::create(&path)
            .await
            .map_err(|e| cannot_create(e.into()))?;
        // Room for the most a segment's buffer grows to, so its frames always fit.
        let size = self.journal.full_bytes() as u64;
        let made = match file.pre_allocate(size, false).await {
            Ok(()) => Ok(()),
            Err(e) => Err(WalFileError::new(
                format!("cannot pre-allocate WAL file {}", path.display()),
                e.into(),
            )),
        };
        let made = match made {
            Ok(()) if fill == WalFill::Written => write_zeros(&file, size).await.map_err(|e| {
                WalFileError::new(format!("cannot write WAL file {}", path.display()), e)
            }),
            other => other,
        };
        let made = made.and_then(|()| {
            sync_dir(&self.config.wal_dir).map_err(|e| WalFileError {
                message: e.to_string(),
                out_of_space: false,
            })
        });
        if let Err(e) = made {
            // Nothing was written to it: a half-made file only takes space.
            let _ = file.remove().await;
            let _ = file.close().await;
            return Err(e);
        }
        Ok(Some((Rc::new(file), path, counter)))
    }

    /// Whether an append of `needed` frame bytes may go to the WAL now (`crate::health`).
    pub(super) fn check_writable(&self, needed: usize) -> Result<(), AppendError> {
        self.journal.check_writable(needed)
    }

    pub(super) fn wal_failed(&self) -> bool {
        self.journal.failed()
    }

    /// Records a change of WAL health: logged once, published for `/ready` and `/metrics`.
    pub(super) fn set_health(&self, health: WalHealth) {
        if self.journal.health_is(&health) {
            return;
        }
        match &health {
            WalHealth::Ok => log::warn!("core {}: the WAL takes appends again", self.core),
            WalHealth::NoNextFile { message, .. } => log::error!(
                "core {}: {message}; appends past the active WAL file are refused until it can be made",
                self.core
            ),
            WalHealth::Failed { message } => log::error!(
                "core {}: WAL failure, appends stop until a restart: {message}",
                self.core
            ),
        }
        self.metrics.wal_health.publish(&health);
        self.journal.set_health(health);
    }

    /// Local durability writes a WAL; memory and object durability do not (object durability
    /// acknowledges from the bucket instead).
    pub(super) fn wal_enabled(&self) -> bool {
        self.config.durability == Durability::Local
    }
}

pub(super) async fn remove_wal(file: Option<Rc<DmaFile>>, path: Option<PathBuf>) {
    drop(file);
    if let Some(path) = path {
        if let Err(e) = std::fs::remove_file(&path) {
            log::warn!("cannot remove WAL file {}: {e}", path.display());
        }
    }
}

/// Whether `path` still names the open WAL `file`. A file removed or replaced under the node
/// (its directory deleted, say) takes writes that recovery will never read: acknowledging
/// them would be a lie.
pub(super) fn same_file(file: &DmaFile, path: &Path) -> Result<(), WalIoError> {
    use std::os::unix::fs::MetadataExt;
    let named = std::fs::metadata(path).map_err(|source| WalIoError::Gone {
        path: path.to_path_buf(),
        source,
    })?;
    let same = named.ino() == file.inode()
        && libc::major(named.dev()) == file.dev_major()
        && libc::minor(named.dev()) == file.dev_minor();
    if same {
        Ok(())
    } else {
        Err(WalIoError::Replaced {
            path: path.to_path_buf(),
        })
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), WalIoError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| WalIoError::SyncDir {
            dir: dir.to_path_buf(),
            source,
        })
}
