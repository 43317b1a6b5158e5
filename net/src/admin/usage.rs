//! The storage a node uses, measured off the request path: the bytes its WAL directory and its
//! SQLite catalog file take on disk, and the segments the catalog lists in the bucket.
//!
//! The admin core measures every `STORAGE_USAGE_REFRESH_MS` (the directory walk on a blocking
//! thread, the catalog sum as one aggregate query on the metadata thread); `/metrics` and
//! `/admin/stats` report the last measurement, so a scrape costs nothing more.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use pico_meta::CatalogUsage;

use crate::admin::AdminState;
use crate::limits::{DISK_USAGE_DEPTH_MAX, DISK_USAGE_ENTRIES_MAX, STORAGE_USAGE_REFRESH_MS};

/// The node's files on its own disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskPaths {
    /// `--wal-dir`: the WAL files, and the node's small state files kept beside them.
    pub wal_dir: PathBuf,
    /// The SQLite catalog (`--meta-url sqlite:<path>`); `None` for Postgres or in memory.
    pub meta_file: Option<PathBuf>,
}

impl DiskPaths {
    pub fn new(wal_dir: PathBuf, meta_url: &str) -> DiskPaths {
        let meta_file = match pico_meta::MetaUrl::parse(meta_url) {
            Ok(pico_meta::MetaUrl::SqliteFile(path)) => Some(path),
            _ => None,
        };
        DiskPaths { wal_dir, meta_file }
    }
}

/// The last measurement; `None` where nothing was measured (yet, or it failed, or there is
/// nothing to measure: no SQLite file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageUsage {
    /// Bytes allocated on disk under the WAL directory (as `du` counts them: a pre-allocated
    /// WAL file counts whole).
    pub wal_bytes: Option<u64>,
    /// Bytes allocated on disk by the SQLite catalog (its file, WAL and shared-memory file).
    pub meta_bytes: Option<u64>,
    /// What the catalog lists in the bucket.
    pub bucket: Option<CatalogUsage>,
    /// When this was measured (Unix ms).
    pub measured_at_ms: Option<u64>,
}

/// Bytes allocated on disk by the files under `dir`, its subdirectories up to `depth_max`
/// levels down, at most `entries_max` entries looked at (then the sum so far). Symbolic links
/// are not followed. An entry that vanishes meanwhile (a WAL file deleted after its upload)
/// is skipped; an unreadable `dir` itself is the error.
pub fn disk_bytes(dir: &Path, depth_max: usize, entries_max: usize) -> std::io::Result<u64> {
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut pending = vec![(dir.to_path_buf(), 0usize)];
    let mut first = true;
    while let Some((path, depth)) = pending.pop() {
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if first => return Err(e),
            Err(_) => continue,
        };
        first = false;
        for entry in entries.flatten() {
            seen += 1;
            if seen > entries_max {
                return Ok(total);
            }
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            total = total.saturating_add(allocated_bytes(&metadata));
            if metadata.is_dir() && depth < depth_max {
                pending.push((entry.path(), depth + 1));
            }
        }
    }
    Ok(total)
}

/// Bytes allocated on disk by the SQLite database at `path` with its `-wal` and `-shm` files
/// (those absent count nothing).
pub fn sqlite_bytes(path: &Path) -> std::io::Result<u64> {
    let main = std::fs::metadata(path)?;
    let mut total = allocated_bytes(&main);
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        if let Ok(metadata) = std::fs::metadata(PathBuf::from(side)) {
            total = total.saturating_add(allocated_bytes(&metadata));
        }
    }
    Ok(total)
}

/// `st_blocks` is in 512-byte units whatever the filesystem's block size (POSIX).
fn allocated_bytes(metadata: &std::fs::Metadata) -> u64 {
    metadata.blocks().saturating_mul(512)
}

/// Measures both disks once, on the calling (blocking) thread.
fn measure_disk(paths: &DiskPaths) -> (Option<u64>, Option<u64>) {
    let wal = disk_bytes(&paths.wal_dir, DISK_USAGE_DEPTH_MAX, DISK_USAGE_ENTRIES_MAX)
        .map_err(|e| log::debug!("measure {}: {e}", paths.wal_dir.display()))
        .ok();
    let meta = paths.meta_file.as_deref().and_then(|path| {
        sqlite_bytes(path)
            .map_err(|e| log::debug!("measure {}: {e}", path.display()))
            .ok()
    });
    (wal, meta)
}

/// Keeps `state.usage` up to date until the node begins shutting down.
pub async fn refresh_loop(state: Rc<AdminState>) {
    while !state.core.is_stopping() {
        let paths = state.facts.disk.clone();
        let (wal_bytes, meta_bytes) = glommio::executor()
            .spawn_blocking(move || measure_disk(&paths))
            .await;
        let bucket = match state.core.meta().catalog_usage().await {
            Ok(Ok(usage)) => Some(usage),
            Ok(Err(e)) => {
                log::debug!("measure the catalog's bucket bytes: {e}");
                None
            }
            Err(_) => None,
        };
        state.usage.set(StorageUsage {
            wal_bytes,
            meta_bytes,
            bucket,
            measured_at_ms: u64::try_from(pico_engine::now_ms()).ok(),
        });
        glommio::timer::sleep(Duration::from_millis(STORAGE_USAGE_REFRESH_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_bytes_counts_allocated_bytes_within_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(disk_bytes(dir.path(), 4, 100).unwrap(), 0);
        std::fs::write(dir.path().join("a"), vec![1u8; 10_000]).unwrap();
        std::fs::create_dir_all(dir.path().join("sub/deeper")).unwrap();
        std::fs::write(dir.path().join("sub/deeper/b"), vec![2u8; 50_000]).unwrap();
        let all = disk_bytes(dir.path(), 4, 100).unwrap();
        // Allocated, so whole blocks: at least the bytes written.
        assert!(all >= 60_000, "{all}");
        // One level down stops above `b`.
        let shallow = disk_bytes(dir.path(), 0, 100).unwrap();
        assert!((10_000..60_000).contains(&shallow), "{shallow}");
        assert!(shallow < all);
        // The entry budget ends the walk early, never in an error.
        assert!(disk_bytes(dir.path(), 4, 1).unwrap() <= all);
        assert!(disk_bytes(&dir.path().join("missing"), 4, 100).is_err());
    }

    #[test]
    fn sqlite_bytes_adds_the_side_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        assert!(sqlite_bytes(&db).is_err());
        std::fs::write(&db, vec![0u8; 8192]).unwrap();
        let alone = sqlite_bytes(&db).unwrap();
        assert!(alone >= 8192, "{alone}");
        std::fs::write(dir.path().join("meta.db-wal"), vec![0u8; 8192]).unwrap();
        assert!(sqlite_bytes(&db).unwrap() >= alone + 8192);
    }

    #[test]
    fn only_a_sqlite_file_catalog_has_a_file_to_measure() {
        let paths = DiskPaths::new("w".into(), "sqlite:/data/meta.db");
        assert_eq!(paths.meta_file, Some(PathBuf::from("/data/meta.db")));
        assert_eq!(
            DiskPaths::new("w".into(), "sqlite::memory:").meta_file,
            None
        );
        assert_eq!(
            DiskPaths::new("w".into(), "postgres://u@h/db").meta_file,
            None
        );
    }
}
