//! The storage backends: plain blocking code, run by the upload thread's blocking pool.
//!
//! Keys reach this module already validated (see `key.rs`), so joining one to the root can
//! never leave the root.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::io::Read;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;

use bytes::Bytes;

use crate::key::TEMP_PREFIX;
use crate::StoreError;

/// One bucket.
pub(crate) enum Backend {
    File(FileBucket),
    Memory(MemoryBucket),
}

impl Backend {
    pub(crate) fn put(
        &self,
        key: &str,
        data: Bytes,
        local_copy: Option<&Path>,
    ) -> Result<(), StoreError> {
        match self {
            Backend::File(bucket) => match local_copy {
                Some(file) if bucket.link(key, file, data.len() as u64)? => Ok(()),
                _ => bucket.put(key, &data),
            },
            Backend::Memory(bucket) => {
                bucket.objects().insert(key.to_string(), data);
                Ok(())
            }
        }
    }

    /// The object's first `bytes_max` bytes (all of it if shorter).
    pub(crate) fn get(&self, key: &str, bytes_max: usize) -> Result<Bytes, StoreError> {
        match self {
            Backend::File(bucket) => bucket.get(key, bytes_max),
            Backend::Memory(bucket) => {
                let objects = bucket.objects();
                let object = objects
                    .get(key)
                    .ok_or_else(|| StoreError::NotFound(key.to_string()))?;
                Ok(object.slice(..object.len().min(bytes_max)))
            }
        }
    }

    pub(crate) fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes, StoreError> {
        if start > end {
            return Err(StoreError::Io(format!(
                "range {start}..{end} of {key} is inverted"
            )));
        }
        match self {
            Backend::File(bucket) => bucket.get_range(key, start, end),
            Backend::Memory(bucket) => {
                let objects = bucket.objects();
                let object = objects
                    .get(key)
                    .ok_or_else(|| StoreError::NotFound(key.to_string()))?;
                check_range(key, start, end, object.len() as u64)?;
                // `Bytes::slice` shares the stored buffer: no copy.
                Ok(object.slice(start as usize..end as usize))
            }
        }
    }

    pub(crate) fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self {
            Backend::File(bucket) => bucket.delete(key),
            Backend::Memory(bucket) => {
                bucket.objects().remove(key);
                Ok(())
            }
        }
    }

    pub(crate) fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        match self {
            Backend::File(bucket) => bucket.list(prefix),
            Backend::Memory(bucket) => {
                let objects = bucket.objects();
                let listed = objects
                    .range(prefix.to_string()..)
                    .take_while(|(key, _)| key.starts_with(prefix))
                    .map(|(key, data)| (key.clone(), data.len() as u64))
                    .collect();
                Ok(listed)
            }
        }
    }
}

/// A range read must lie inside the object: a short read would hand the engine a truncated
/// segment that only fails later, at a CRC check far from the cause.
pub(crate) fn check_range(key: &str, start: u64, end: u64, size: u64) -> Result<(), StoreError> {
    if end > size {
        return Err(StoreError::Short {
            key: key.to_string(),
            start,
            end,
            size,
        });
    }
    Ok(())
}

fn io_error(doing: &str, path: &Path, error: io::Error) -> StoreError {
    StoreError::Io(format!("{doing} {}: {error}", path.display()))
}

/// `mem://NAME` buckets, shared process-wide by name: a node restarted inside one test process
/// finds the objects its previous incarnation stored, as it would on a real bucket.
pub(crate) struct MemoryBucket {
    objects: SharedObjects,
}

/// One in-memory bucket's objects, sorted by key so `list` is a range scan.
type SharedObjects = Arc<Mutex<BTreeMap<String, Bytes>>>;

impl MemoryBucket {
    pub(crate) fn open(name: &str) -> MemoryBucket {
        static BUCKETS: OnceLock<Mutex<HashMap<String, SharedObjects>>> = OnceLock::new();
        let buckets = BUCKETS.get_or_init(Default::default);
        let mut buckets = buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let objects = buckets.entry(name.to_string()).or_default().clone();
        MemoryBucket { objects }
    }

    /// The map is only touched by short, non-panicking code, so a poisoned lock still holds a
    /// consistent map.
    fn objects(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        self.objects
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A `file://` bucket: object `a/b/c` is the file `<root>/a/b/c`.
///
/// A put writes `<dir>/.pico-tmp.<name>.<pid>.<n>`, fsyncs it, renames it over `<dir>/<name>`
/// and fsyncs `<dir>`: readers see the old object or the whole new one, never a torn one, and
/// once the put is answered the object survives power loss. A crash mid-put can leave a
/// `.pico-tmp.*` file behind: `list` ignores those, and they are safe to delete while no node
/// runs (they are not removed at open, because a data and a WAL bucket may share one directory
/// and another store could be writing its temporary file right then).
pub(crate) struct FileBucket {
    root: PathBuf,
}

/// Makes temporary names unique among concurrent puts of this process (the pid covers other
/// processes).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl FileBucket {
    /// Creates the root directory (and its parents) if needed.
    pub(crate) fn open(root: &Path) -> Result<FileBucket, StoreError> {
        if !root.is_dir() {
            std::fs::create_dir_all(root)
                .map_err(|error| io_error("create bucket directory", root, error))?;
            // Make the new directory's own entry durable, like any directory we create.
            if let Some(parent) = root
                .parent()
                .filter(|parent| !parent.as_os_str().is_empty())
            {
                sync_dir(parent)?;
            }
        }
        Ok(FileBucket {
            root: root.to_path_buf(),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Where object `key` goes: its path, its directory (created if missing) and a fresh
    /// temporary name next to it.
    fn places(&self, key: &str) -> Result<(PathBuf, PathBuf, PathBuf), StoreError> {
        let path = self.path(key);
        let dir = path
            .parent()
            .expect("a key joined to the root has a parent")
            .to_path_buf();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .expect("validated keys are UTF-8 names");
        if !dir.is_dir() {
            self.create_dirs(&dir)?;
        }
        let counter = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(
            "{TEMP_PREFIX}{name}.{}.{counter}",
            std::process::id()
        ));
        Ok((path, dir, temp))
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        let (path, dir, temp) = self.places(key)?;
        let written = write_synced(&temp, data).and_then(|()| {
            std::fs::rename(&temp, &path).map_err(|error| io_error("rename into", &path, error))
        });
        if let Err(error) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(error);
        }
        // The rename is only durable once the directory holding both names is.
        sync_dir(&dir)
    }

    /// Makes the object `key` the first `len` bytes of `file`, a durable local file holding
    /// exactly the object's bytes there, without copying them: `file` is cut to `len` (and
    /// fsynced, for its size), hard-linked under a temporary name, renamed over the key and the
    /// directory fsynced, so readers see the old object or the new one, as with `put`. `false`
    /// when the link is not possible (another filesystem, a filesystem without hard links, the
    /// file gone): the caller writes the bytes instead.
    fn link(&self, key: &str, file: &Path, len: u64) -> Result<bool, StoreError> {
        // The bytes are in memory as well: a local copy that cannot be prepared is written
        // out instead, never a failed put.
        let prepared = std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .and_then(|source| source.set_len(len).and_then(|()| source.sync_all()));
        if let Err(error) = prepared {
            log::warn!(
                "cannot link {} into the bucket, writing the object instead: {error}",
                file.display()
            );
            return Ok(false);
        }
        let (path, dir, temp) = self.places(key)?;
        if let Err(error) = std::fs::hard_link(file, &temp) {
            static LOGGED: std::sync::Once = std::sync::Once::new();
            LOGGED.call_once(|| {
                log::info!(
                    "file:// bucket {}: segments are copied, not linked ({error})",
                    self.root.display()
                )
            });
            return Ok(false);
        }
        if let Err(error) = std::fs::rename(&temp, &path) {
            let _ = std::fs::remove_file(&temp);
            return Err(io_error("rename into", &path, error));
        }
        sync_dir(&dir)?;
        Ok(true)
    }

    /// Creates `dir` and the missing directories above it, then fsyncs every directory from
    /// `dir`'s parent up to the root, so each new entry is durable before an object's rename
    /// relies on it. Only the first put into a new directory pays for this.
    fn create_dirs(&self, dir: &Path) -> Result<(), StoreError> {
        std::fs::create_dir_all(dir).map_err(|error| io_error("create directory", dir, error))?;
        let mut ancestor = dir.parent();
        while let Some(current) = ancestor {
            sync_dir(current)?;
            if current == self.root {
                break;
            }
            ancestor = current.parent();
        }
        Ok(())
    }

    fn get(&self, key: &str, bytes_max: usize) -> Result<Bytes, StoreError> {
        let path = self.path(key);
        if path.is_dir() {
            return Err(StoreError::NotFound(key.to_string())); // a key prefix, not an object
        }
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(key.to_string()))
            }
            Err(error) => return Err(io_error("open", &path, error)),
        };
        let mut data = Vec::new();
        file.take(u64::try_from(bytes_max).unwrap_or(u64::MAX))
            .read_to_end(&mut data)
            .map_err(|error| io_error("read", &path, error))?;
        Ok(Bytes::from(data))
    }

    fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes, StoreError> {
        let path = self.path(key);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(key.to_string()))
            }
            Err(error) => return Err(io_error("open", &path, error)),
        };
        let metadata = file
            .metadata()
            .map_err(|error| io_error("stat", &path, error))?;
        if metadata.is_dir() {
            return Err(StoreError::NotFound(key.to_string()));
        }
        check_range(key, start, end, metadata.len())?;
        let length = usize::try_from(end - start).map_err(|_| {
            StoreError::Io(format!(
                "range {start}..{end} of {key} does not fit in memory"
            ))
        })?;
        let mut data = vec![0u8; length];
        file.read_exact_at(&mut data, start)
            .map_err(|error| io_error("read", &path, error))?;
        Ok(Bytes::from(data))
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key);
        if path.is_dir() {
            return Ok(()); // a key prefix, not an object: nothing to delete
        }
        // No directory fsync: a delete that is lost in a crash leaves garbage that the next GC
        // pass deletes again; it can never expose wrong data.
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(io_error("delete", &path, error)),
        }
    }

    /// Walks only the directory the prefix points into (`segments/00` walks `segments/`), not the
    /// whole bucket.
    fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let base = match prefix.rfind('/') {
            Some(slash) => &prefix[..=slash],
            None => "",
        };
        let mut listed = Vec::new();
        let mut pending = vec![(self.root.join(base), base.to_string())];
        while let Some((dir, dir_key)) = pending.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(io_error("list", &dir, error)),
            };
            for entry in entries {
                let entry = entry.map_err(|error| io_error("list", &dir, error))?;
                // Names that are not UTF-8 were not written by us and cannot be keys.
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                if name.starts_with(TEMP_PREFIX) {
                    continue;
                }
                let key = format!("{dir_key}{name}");
                let file_type = entry
                    .file_type()
                    .map_err(|error| io_error("stat", &entry.path(), error))?;
                if file_type.is_dir() {
                    // Descend only where keys with the prefix can be.
                    let dir_prefix = format!("{key}/");
                    if dir_prefix.starts_with(prefix) || prefix.starts_with(&dir_prefix) {
                        pending.push((entry.path(), dir_prefix));
                    }
                } else if file_type.is_file() && key.starts_with(prefix) {
                    let size = entry
                        .metadata()
                        .map_err(|error| io_error("stat", &entry.path(), error))?
                        .len();
                    listed.push((key, size));
                }
            }
        }
        listed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(listed)
    }
}

/// Writes `data` to a new file at `path` and fsyncs it (data and metadata).
fn write_synced(path: &Path, data: &[u8]) -> Result<(), StoreError> {
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|error| io_error("create", path, error))?;
    file.write_all(data)
        .map_err(|error| io_error("write", path, error))?;
    file.sync_all()
        .map_err(|error| io_error("fsync", path, error))
}

/// fsyncs a directory, making the entries created or renamed in it durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(|error| io_error("fsync directory", dir, error))
}
