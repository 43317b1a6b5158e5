//! WAL files: their names, creation (pre-allocated, their head or all of them written through
//! with zeros, directory entry durable), removal and
//! identity checks, and changes of the WAL's health (whether appends may go to it, see
//! `crate::health`), logged and published here and held by the journal.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use glommio::io::DmaFile;

use crate::config::Durability;
use crate::health::{WalFault, WalHealth};
use crate::placement::segment_key;

use super::journal::WalFile;
use super::state::Shard;

/// How a new WAL file's blocks are made ready.
///
/// A pre-allocated file's extents are *unwritten* (ext4, XFS): the first write to each block
/// converts it, so a commit round's DMA write cannot complete in io_uring's submitting call
/// (it is handed to a kernel worker thread), and its `fdatasync` also writes the changed
/// extent map. Written through with zeros once, blocks take every round as a plain
/// overwrite: one device write and one cache flush (a lone 4 KiB round and its `fdatasync`:
/// 110-130 µs instead of 180-190 µs at the median here). Every file gets at least its head
/// written through: what a slow writer's segment, sealed by age, is expected to hold
/// (`Journal::next_fill`). Writing a whole file costs its size in writes, so only a writer
/// that fills segments in small rounds gets it (`Journal::filling`, at most doubling the bytes
/// it writes); for a writer of large rounds the rest stays reserved, as the zeros would cost
/// more than they save.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WalFill {
    /// Blocks reserved (`fallocate`), the first this many bytes written with zeros.
    Head(usize),
    /// Blocks reserved, then all written with zeros.
    Written,
}

/// Bytes of zeros one write of [`WalFill::Written`] puts down.
const ZERO_WRITE_BYTES: usize = 1 << 20;

/// Writes `size` bytes of zeros over `file` from its start, then makes them durable. One
/// buffer of zeros serves every whole chunk; only a shorter last chunk gets its own.
async fn write_zeros(file: &DmaFile, size: u64) -> std::io::Result<()> {
    let align = super::journal::wal_block_bytes(file);
    let zeroed = |len: usize| {
        let mut zeros = file.alloc_dma_buffer(len.div_ceil(align) * align);
        zeros.as_bytes_mut().fill(0);
        zeros
    };
    let chunk = Rc::new(zeroed(ZERO_WRITE_BYTES.min(size as usize)));
    let mut at = 0u64;
    while at < size {
        let left = (size - at) as usize;
        let (written, len) = if left >= chunk.len() {
            (file.write_rc_at(chunk.clone(), at).await?, chunk.len())
        } else {
            let tail = zeroed(left);
            let len = tail.len();
            (file.write_at(tail, at).await?, len)
        };
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
    /// What this core's WAL files of this run are named by: `<epoch>-<core>`.
    pub(super) fn wal_group(&self) -> String {
        format!("{:016}-{:03}", self.config.node_epoch_ms, self.core)
    }

    pub(super) fn wal_path(&self, counter: u64) -> (PathBuf, String) {
        let stem = format!("{}-{counter:010}", self.wal_group());
        (
            self.config.wal_dir.join(format!("{stem}.wal")),
            segment_key(
                self.config.catalog_id.as_deref(),
                self.config.node_id,
                &stem,
            ),
        )
    }

    /// Creates the next WAL file (pre-allocated, written through with zeros as far as `fill`
    /// says, with its directory entry durable, and listed in the core's ledger).
    pub(super) async fn create_wal_file(&self, fill: WalFill) -> Result<Option<WalFile>, WalFault> {
        let counter = self.journal.next_counter();
        if !self.wal_enabled() {
            return Ok(None);
        }
        let (path, _) = self.wal_path(counter);
        let cannot_create = |e: std::io::Error| WalFault::Create {
            path: path.clone(),
            source: Arc::new(e),
        };
        #[cfg(feature = "fault-injection")]
        if let Some(e) = crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Create) {
            self.journal.give_back_counter(counter);
            return Err(cannot_create(e));
        }
        let file = match DmaFile::create(&path).await {
            Ok(file) => file,
            Err(e) => {
                self.journal.give_back_counter(counter);
                return Err(cannot_create(e.into()));
            }
        };
        // Room for the most a segment's buffer grows to, so its frames always fit.
        let size = self.journal.full_bytes() as u64;
        let made = async {
            // The directory entry first, durably: the ledger may then list the file while its
            // room is made (a crash between leaves a listed file with no frames, which
            // recovery removes), so the ledger's write costs the spare no time of its own.
            sync_dir(&self.config.wal_dir)?;
            let room = async {
                file.pre_allocate(size, false)
                    .await
                    .map_err(|e| WalFault::PreAllocate {
                        path: path.clone(),
                        source: Arc::new(e.into()),
                    })?;
                let zeros = match fill {
                    WalFill::Head(bytes) => size.min(bytes as u64),
                    WalFill::Written => size,
                };
                write_zeros(&file, zeros)
                    .await
                    .map_err(|e| WalFault::WriteZeros {
                        path: path.clone(),
                        source: Arc::new(e),
                    })
            };
            let listed = async {
                match self.ledger.get() {
                    Some(ledger) => ledger.add(counter).await.map_err(|e| WalFault::Ledger {
                        path: ledger.path().to_path_buf(),
                        source: Arc::new(e),
                    }),
                    None => Ok(()),
                }
            };
            let (room, listed) = futures_util::future::join(room, listed).await;
            room.and(listed)
        }
        .await;
        if let Err(e) = made {
            // No frame was written to it: a half-made file only takes space. The ledger may
            // list it (its write may have gone through, or failed after), so it goes only once
            // the ledger says it does not (else the next start finds it empty and removes it).
            let unlisted = match self.ledger.get() {
                Some(ledger) => ledger.retire(counter).await.is_ok(),
                None => true,
            };
            // A file removed gives its name back: the retry makes the same one, so a full disk
            // is one fault, logged once, not a new one every retry.
            if unlisted && file.remove().await.is_ok() {
                self.journal.give_back_counter(counter);
            }
            let _ = file.close().await;
            return Err(e);
        }
        Ok(Some((Rc::new(file), path, counter)))
    }

    /// Records a change of WAL health: logged once, published for `/ready` and `/metrics`.
    pub(super) fn set_health(&self, health: WalHealth) {
        if self.journal.health_is(&health) {
            return;
        }
        match &health {
            WalHealth::Ok => log::warn!("core {}: the WAL takes appends again", self.core),
            WalHealth::NoNextFile { fault } => log::error!(
                "core {}: {fault}; appends past the active WAL file are refused until it can be made",
                self.core
            ),
            WalHealth::Failed { fault } => log::error!(
                "core {}: WAL failure, appends stop until a restart: {fault}",
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

    /// Retires a WAL file beside what follows ([`Shard::retire_wal`] on a task of its own),
    /// counted in `retiring` until it is done.
    pub(super) fn spawn_retire_wal(
        self: &Rc<Self>,
        file: Option<Rc<DmaFile>>,
        path: Option<PathBuf>,
    ) {
        self.retiring.set(self.retiring.get() + 1);
        let shard = self.clone();
        glommio::spawn_local(async move {
            shard.retire_wal(file, path).await;
            shard.retiring.set(shard.retiring.get() - 1);
        })
        .detach();
    }

    /// Removes a WAL file whose segment is stored (or held nothing), once the core's ledger
    /// no longer lists it. A file the ledger cannot let go of stays: the next start finds its
    /// segment stored and removes it.
    async fn retire_wal(&self, file: Option<Rc<DmaFile>>, path: Option<PathBuf>) {
        drop(file);
        let Some(path) = path else {
            return;
        };
        let counter = crate::wal_ledger::group_and_counter(&path).map(|(_, counter)| counter);
        if let (Some(ledger), Some(counter)) = (self.ledger.get(), counter) {
            if let Err(e) = ledger.retire(counter).await {
                log::warn!(
                    "cannot take WAL file {} out of ledger {}: {e}; the file stays until the \
                     next start",
                    path.display(),
                    ledger.path().display()
                );
                return;
            }
        }
        if let Err(e) = std::fs::remove_file(&path) {
            log::warn!("cannot remove WAL file {}: {e}", path.display());
        }
    }
}

/// Whether `path` still names the open WAL `file`. A file removed or replaced under the node
/// (its directory deleted, say) takes writes that recovery will never read: acknowledging
/// them would be a lie.
pub(super) fn same_file(file: &DmaFile, path: &Path) -> Result<(), WalFault> {
    use std::os::unix::fs::MetadataExt;
    let named = std::fs::metadata(path).map_err(|source| WalFault::Gone {
        path: path.to_path_buf(),
        source: Arc::new(source),
    })?;
    let same = named.ino() == file.inode()
        && libc::major(named.dev()) == file.dev_major()
        && libc::minor(named.dev()) == file.dev_minor();
    if same {
        Ok(())
    } else {
        Err(WalFault::Replaced {
            path: path.to_path_buf(),
        })
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), WalFault> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| WalFault::SyncDir {
            dir: dir.to_path_buf(),
            source: Arc::new(source),
        })
}
