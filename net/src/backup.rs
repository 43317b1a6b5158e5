//! Backups of a serving node and restores from them (docs/backup.md): the files a backup
//! directory holds, the blocking parts of taking one (after the admin handler has held the
//! garbage collector and checkpointed every core, `admin/backup.rs`), and the restore that
//! `pico admin restore` runs.
//!
//! ```text
//! <backup>/meta.db          the catalog, as of one commit after the checkpoint (VACUUM INTO)
//! <backup>/objects/         a file:// bucket: every object that catalog names, as stored
//! <backup>/wal/             the subscription state files, as of the cut (subscriptions.json,
//!                           subscriptions.d/); a restored node's --wal-dir starts from it
//! <backup>/manifest.json    written last (temporary name, fsync, rename): a backup without it
//!                           is incomplete and refused by restore
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_lite::future::block_on;
use pico_meta::backup::{copy_sqlite_catalog, read_catalog_copy, CatalogCopy};
use pico_meta::MetaStore;
use pico_s3::{ObjectStore, StorageUri, StoreError};
use serde_json::{json, Value};

use crate::limits::UNSIZED_OBJECT_BYTES_MAX;
use crate::subscriptions::Subscriptions;

mod error;

use error::file;
pub use error::{BackupError, FileAction};

pub const MANIFEST_FILE: &str = "manifest.json";
pub const CATALOG_FILE: &str = "meta.db";
pub const OBJECTS_DIR: &str = "objects";
/// The part of a node's `--wal-dir` a backup keeps: the subscription state.
pub const STATE_DIR: &str = "wal";
/// What `kind` a manifest names.
const MANIFEST_KIND: &str = "picomq-backup";
/// The manifest format this build writes and the newest it reads.
pub const MANIFEST_FORMAT: u64 = 1;
/// The bucket id a restored `file://` bucket is named with (the catalog names no bucket id:
/// object keys are the same in any bucket).
const RESTORED_BUCKET_ID: i16 = -2;

/// Where a backup goes and what it may take.
pub struct BackupJob {
    /// The backup directory: created empty by the caller.
    pub to: PathBuf,
    /// The node's SQLite catalog.
    pub db: PathBuf,
    /// The node's bucket, read by the node's own client (file:// or s3://).
    pub source: ObjectStore,
    pub deadline: Instant,
    /// Object bytes read per second at most (a backup's load on a serving node).
    pub max_bytes_per_second: Option<u64>,
    /// What the manifest says of the node and the cut.
    pub facts: Value,
}

/// What a finished backup holds.
#[derive(Debug)]
pub struct BackupSummary {
    pub streams: usize,
    pub objects: usize,
    pub object_bytes: u64,
    pub catalog_copied_at_ms: i64,
    /// Objects the catalog copy names that the bucket no longer had, each one that no
    /// stream needs (a collector round stopped by a crash between deleting it and its row).
    pub skipped_garbage: Vec<String>,
}

/// Copies the subscription state (the cut: before the checkpoint) into `<to>/wal`.
pub fn copy_subscriptions(
    to: &Path,
    subscriptions: Option<&Arc<Subscriptions>>,
) -> Result<usize, BackupError> {
    let dir = to.join(STATE_DIR);
    std::fs::create_dir_all(&dir).map_err(file(FileAction::Create, &dir))?;
    match subscriptions {
        Some(subscriptions) => subscriptions
            .back_up_to(&dir)
            .map_err(BackupError::Subscriptions),
        None => Ok(0),
    }
}

/// The catalog copy, every object it names, then the manifest. Blocking (file and bucket
/// I/O): run it off the cores. On an error the directory stays without a manifest.
pub fn write_backup(job: &BackupJob, subscriptions: usize) -> Result<BackupSummary, BackupError> {
    let catalog_path = job.to.join(CATALOG_FILE);
    let catalog = copy_sqlite_catalog(&job.db, &catalog_path).map_err(BackupError::CatalogCopy)?;
    let catalog_copied_at_ms = pico_engine::now_ms();
    let objects_dir = job.to.join(OBJECTS_DIR);
    let dest = open_file_bucket(&objects_dir)?;
    let started = Instant::now();
    let mut copied = Vec::new();
    let mut missing = Vec::new();
    let mut object_bytes: u64 = 0;
    for (key, size) in &catalog.objects {
        if Instant::now() >= job.deadline {
            return Err(BackupError::OutOfTime {
                copied: copied.len(),
                total: catalog.objects.len(),
            });
        }
        let bytes = match read_cataloged(&job.source, key, *size) {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(StoreError::NotFound(_))) => {
                missing.push(key.clone());
                continue;
            }
            Ok(Err(source)) => {
                return Err(BackupError::ReadObject {
                    key: key.clone(),
                    source,
                })
            }
            Err(_) => return Err(BackupError::SourceStopped),
        };
        if let Some(size) = size {
            if bytes.len() as u64 != *size {
                return Err(BackupError::SizeMismatch {
                    key: key.clone(),
                    holds: bytes.len(),
                    catalog: *size,
                });
            }
        }
        // A damaged object copied as it is would make the backup a second copy of the damage,
        // found only when someone reads it after a restore: refused here, naming it.
        if let Some((at, error)) = pico_engine::frame::first_damage(&bytes) {
            return Err(BackupError::DamagedObject {
                key: key.clone(),
                at,
                error: format!("{error:?}"),
            });
        }
        let digest = sha256_hex(&bytes);
        let length = bytes.len() as u64;
        put(&dest, key, bytes)?;
        object_bytes = object_bytes.saturating_add(length);
        copied.push(json!({ "key": key, "size": length, "sha256": digest }));
        throttle(
            started,
            object_bytes,
            job.max_bytes_per_second,
            job.deadline,
        )?;
    }
    let skipped_garbage = check_missing(&catalog_path, missing)?;
    dest.shutdown();
    sync_tree(&objects_dir)?;
    let streams: Vec<Value> = catalog
        .streams
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "id": s.id,
                "startOffset": s.start_offset,
                "nextOffset": s.next_offset,
                "closed": s.closed,
                "softDeleted": s.soft_deleted,
                "forkSource": s.fork_source,
            })
        })
        .collect();
    let mut manifest = json!({
        "kind": MANIFEST_KIND,
        "format": MANIFEST_FORMAT,
        "catalog": { "file": CATALOG_FILE, "schemaVersion": catalog.schema_version },
        "catalogCopiedAtMs": catalog_copied_at_ms,
        "finishedAtMs": pico_engine::now_ms(),
        "subscriptions": subscriptions,
        "objects": copied,
        "objectBytes": object_bytes,
        "skippedGarbage": skipped_garbage,
        "streams": streams,
    });
    if let (Some(manifest), Value::Object(facts)) = (manifest.as_object_mut(), &job.facts) {
        manifest.extend(facts.clone());
    }
    write_manifest(&job.to, &manifest)?;
    Ok(BackupSummary {
        streams: catalog.streams.len(),
        objects: copied.len(),
        object_bytes,
        catalog_copied_at_ms,
        skipped_garbage,
    })
}

/// Objects the catalog copy names that the bucket does not have are acceptable only when no
/// stream of the copy needs them (a collector round deleted them and a crash came before their
/// rows went, before the backup held the collector); anything else is data the backup cannot
/// hold. Asked of the copy itself, not the node's catalog: a segment the node no longer needs
/// may be one the copy's streams (trimmed less far) still read.
fn check_missing(catalog: &Path, missing: Vec<String>) -> Result<Vec<String>, BackupError> {
    if missing.is_empty() {
        return Ok(missing);
    }
    let url = pico_meta::MetaUrl::SqliteFile(catalog.to_path_buf());
    let (copy, _) = MetaStore::open(&url).map_err(|source| BackupError::Catalog {
        path: catalog.to_path_buf(),
        source,
    })?;
    let garbage = block_on(copy.garbage_segments(i64::MAX));
    copy.shutdown();
    let garbage = garbage
        .map_err(|_| BackupError::CatalogStopped)?
        .map_err(BackupError::MissingObjects)?;
    let garbage: std::collections::HashSet<String> = garbage.into_iter().collect();
    if let Some(needed) = missing.iter().find(|key| !garbage.contains(*key)) {
        return Err(BackupError::Needed {
            key: needed.clone(),
        });
    }
    Ok(missing)
}

/// An object the catalog names, read no further than its row says it holds: a compaction
/// stores its merged object under the first merged key before its catalog swap (engine
/// `shard/compact.rs`), longer than the row says, its first bytes the ones the row names. An
/// object without a size (a quarantined segment) is read up to [`UNSIZED_OBJECT_BYTES_MAX`]
/// and is an error past it: the store's answer is not trusted to end. `Err`: the bucket
/// client stopped.
pub(crate) fn read_cataloged(
    store: &ObjectStore,
    key: &str,
    size_bytes: Option<u64>,
) -> Result<Result<Bytes, StoreError>, futures_channel::oneshot::Canceled> {
    let bytes_max = match size_bytes {
        Some(size) => usize::try_from(size).unwrap_or(usize::MAX),
        None => UNSIZED_OBJECT_BYTES_MAX.saturating_add(1),
    };
    Ok(block_on(store.get(key, bytes_max))?.and_then(|bytes| {
        if size_bytes.is_none() && bytes.len() > UNSIZED_OBJECT_BYTES_MAX {
            return Err(StoreError::Io(format!(
                "{key} has no catalog size and is longer than the {UNSIZED_OBJECT_BYTES_MAX} \
                 bytes read of such an object"
            )));
        }
        Ok(bytes)
    }))
}

/// When a reader that started at `started` and has read `bytes` may read on, to keep its
/// average rate at `max_bytes_per_second` (`None`: no limit).
pub(crate) fn pace_until(
    started: Instant,
    bytes: u64,
    max_bytes_per_second: Option<u64>,
) -> Option<Instant> {
    let rate = max_bytes_per_second.filter(|r| *r > 0)?;
    Some(started + Duration::from_secs_f64(bytes as f64 / rate as f64))
}

/// Sleeps as long as it takes to keep the average read rate at `max_bytes_per_second`; an
/// error when that would go past `deadline` (the backup cannot finish in its time).
fn throttle(
    started: Instant,
    bytes: u64,
    max_bytes_per_second: Option<u64>,
    deadline: Instant,
) -> Result<(), BackupError> {
    let Some(wake) = pace_until(started, bytes, max_bytes_per_second) else {
        return Ok(());
    };
    if wake > deadline {
        return Err(BackupError::TooSlow {
            bytes,
            rate: max_bytes_per_second.unwrap_or(0),
        });
    }
    let now = Instant::now();
    if wake > now {
        std::thread::sleep(wake - now);
    }
    Ok(())
}

fn open_file_bucket(dir: &Path) -> Result<ObjectStore, BackupError> {
    let uri = StorageUri {
        bucket_id: RESTORED_BUCKET_ID,
        location: pico_s3::StorageLocation::File(dir.to_path_buf()),
    };
    ObjectStore::open(&uri).map_err(|source| BackupError::OpenBucket {
        dir: dir.to_path_buf(),
        source,
    })
}

fn put(store: &ObjectStore, key: &str, bytes: Bytes) -> Result<(), BackupError> {
    let failed = |source| BackupError::WriteObject {
        key: key.to_string(),
        source,
    };
    match block_on(store.put(key, bytes)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(failed(Some(e))),
        Err(_) => Err(failed(None)),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every directory under `root` (and `root`) fsynced, so the names of the files in them are
/// durable before the manifest says the backup is whole.
fn sync_tree(root: &Path) -> Result<(), BackupError> {
    let failed = |path: &Path, e: std::io::Error| file(FileAction::Sync, path)(e);
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(failed(&dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| failed(&dir, e))?;
            if entry.file_type().map_err(|e| failed(&dir, e))?.is_dir() {
                dirs.push(entry.path());
            }
        }
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| failed(&dir, e))?;
    }
    Ok(())
}

/// The manifest, written last: a temporary file, fsync, rename, directory fsync.
fn write_manifest(dir: &Path, manifest: &Value) -> Result<(), BackupError> {
    use std::io::Write;
    let path = dir.join(MANIFEST_FILE);
    let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
    let failed = file(FileAction::Write, &path);
    let mut bytes = serde_json::to_vec_pretty(manifest).map_err(BackupError::Encode)?;
    bytes.push(b'\n');
    let mut out = std::fs::File::create(&tmp).map_err(&failed)?;
    out.write_all(&bytes).map_err(&failed)?;
    out.sync_all().map_err(&failed)?;
    std::fs::rename(&tmp, &path).map_err(&failed)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(&failed)
}

/// Where a restore puts the node's files.
#[derive(Debug)]
pub struct RestoreTarget {
    /// A new or empty directory: it receives `meta.db` and `wal/` (and `objects/` unless
    /// `storage` names another bucket).
    pub dir: PathBuf,
    /// The bucket to put the objects in (`--storage`'s syntax); `None`: `<dir>/objects`.
    pub storage: Option<String>,
}

/// What a restore made, and how to start a node on it.
#[derive(Debug)]
pub struct RestoreSummary {
    pub meta_url: String,
    pub storage: String,
    pub wal_dir: PathBuf,
    pub streams: usize,
    pub objects: usize,
    pub object_bytes: u64,
    /// The manifest's cut and node facts.
    pub started_at_ms: Option<i64>,
}

/// Checks the backup at `from` (manifest present and of a known format, catalog and objects
/// as it lists them, each object's size and SHA-256) and lays it out for a new node. Blocking.
pub fn restore(from: &Path, target: &RestoreTarget) -> Result<RestoreSummary, BackupError> {
    let manifest = read_manifest(from)?;
    let catalog_path = from.join(CATALOG_FILE);
    let catalog = read_catalog_copy(&catalog_path).map_err(|source| BackupError::Catalog {
        path: catalog_path.clone(),
        source,
    })?;
    let listed = listed_objects(&manifest)?;
    check_catalog_against_manifest(&catalog, &listed, &manifest)?;
    prepare_empty_dir(&target.dir)?;
    let source = open_file_bucket(&from.join(OBJECTS_DIR))?;
    let (dest, storage) = match &target.storage {
        Some(uri) => {
            let bucket = |source| BackupError::Bucket {
                uri: uri.clone(),
                source,
            };
            let parsed = StorageUri::parse(uri).map_err(BackupError::StorageUri)?;
            let store = ObjectStore::open(&parsed).map_err(|e| bucket(Some(e)))?;
            // A node's bucket holds one catalog's objects: never mix two.
            match block_on(store.list("")) {
                Ok(Ok(listed)) if listed.is_empty() => {}
                Ok(Ok(listed)) => {
                    return Err(BackupError::BucketNotEmpty {
                        uri: uri.clone(),
                        objects: listed.len(),
                    })
                }
                Ok(Err(e)) => return Err(bucket(Some(e))),
                Err(_) => return Err(bucket(None)),
            }
            (store, uri.clone())
        }
        None => {
            let dir = absolute(&target.dir.join(OBJECTS_DIR))?;
            let store = open_file_bucket(&dir)?;
            (
                store,
                format!("{RESTORED_BUCKET_ID}@file://{}", dir.display()),
            )
        }
    };
    let mut object_bytes: u64 = 0;
    for (key, size, sha256) in &listed {
        // One byte more than the manifest says, so a longer object is found.
        let bytes_max = usize::try_from(size.saturating_add(1)).unwrap_or(usize::MAX);
        let bytes = match block_on(source.get(key, bytes_max)) {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => {
                return Err(BackupError::BackupObject {
                    key: key.clone(),
                    source: Some(e),
                })
            }
            Err(_) => {
                return Err(BackupError::BackupObject {
                    key: key.clone(),
                    source: None,
                })
            }
        };
        if bytes.len() as u64 != *size || sha256_hex(&bytes) != *sha256 {
            return Err(BackupError::Damaged { key: key.clone() });
        }
        object_bytes = object_bytes.saturating_add(*size);
        put(&dest, key, bytes)?;
    }
    dest.shutdown();
    source.shutdown();
    let meta_path = target.dir.join(CATALOG_FILE);
    copy_new_file(&catalog_path, &meta_path)?;
    let wal_dir = target.dir.join(STATE_DIR);
    copy_dir(&from.join(STATE_DIR), &wal_dir)?;
    sync_tree(&target.dir)?;
    Ok(RestoreSummary {
        meta_url: format!("sqlite:{}", absolute(&meta_path)?.display()),
        storage,
        wal_dir: absolute(&wal_dir)?,
        streams: catalog.streams.len(),
        objects: listed.len(),
        object_bytes,
        started_at_ms: manifest["startedAtMs"].as_i64(),
    })
}

/// The manifest of the backup at `dir`; a missing one is an incomplete backup.
pub fn read_manifest(dir: &Path) -> Result<Value, BackupError> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.is_dir() => {
            return Err(file(FileAction::Read, dir)(e))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(BackupError::Incomplete {
                dir: dir.to_path_buf(),
            })
        }
        Err(e) => return Err(file(FileAction::Read, &path)(e)),
    };
    let manifest: Value =
        serde_json::from_slice(&bytes).map_err(|source| BackupError::ManifestJson {
            path: path.clone(),
            source,
        })?;
    if manifest["kind"] != MANIFEST_KIND {
        return Err(BackupError::NotAManifest { path });
    }
    match manifest["format"].as_u64() {
        Some(format) if (1..=MANIFEST_FORMAT).contains(&format) => Ok(manifest),
        Some(format) => Err(BackupError::NewerFormat { path, format }),
        None => Err(BackupError::NoFormat { path }),
    }
}

/// `(key, size, sha256)` of each object the manifest lists.
fn listed_objects(manifest: &Value) -> Result<Vec<(String, u64, String)>, BackupError> {
    let objects = manifest["objects"]
        .as_array()
        .ok_or(BackupError::NoObjects)?;
    objects
        .iter()
        .map(|object| {
            match (
                object["key"].as_str(),
                object["size"].as_u64(),
                object["sha256"].as_str(),
            ) {
                (Some(key), Some(size), Some(sha256)) => {
                    Ok((key.to_string(), size, sha256.to_string()))
                }
                _ => Err(BackupError::MalformedEntry {
                    entry: object.to_string(),
                }),
            }
        })
        .collect()
}

/// Every object the catalog copy names is in the manifest, except the garbage the backup
/// skipped (so the catalog and the objects are one backup's).
fn check_catalog_against_manifest(
    catalog: &CatalogCopy,
    listed: &[(String, u64, String)],
    manifest: &Value,
) -> Result<(), BackupError> {
    let listed: std::collections::HashSet<&str> =
        listed.iter().map(|(k, _, _)| k.as_str()).collect();
    let skipped: std::collections::HashSet<&str> = manifest["skippedGarbage"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (key, _) in &catalog.objects {
        if !listed.contains(key.as_str()) && !skipped.contains(key.as_str()) {
            return Err(BackupError::NotOneBackup { key: key.clone() });
        }
    }
    Ok(())
}

/// Creates `dir`, or accepts it empty; anything else is refused (a restore never mixes with
/// other files).
pub fn prepare_empty_dir(dir: &Path) -> Result<(), BackupError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::NotEmpty {
                    dir: dir.to_path_buf(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(dir).map_err(file(FileAction::Create, dir))
        }
        Err(source) => Err(BackupError::Path {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

fn absolute(path: &Path) -> Result<PathBuf, BackupError> {
    std::path::absolute(path).map_err(|source| BackupError::Path {
        path: path.to_path_buf(),
        source,
    })
}

/// Copies `from` to the new file `to`, readable by its owner only (the subscription state
/// holds keys), fsynced.
fn copy_new_file(from: &Path, to: &Path) -> Result<(), BackupError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut source = std::fs::File::open(from).map_err(file(FileAction::Read, from))?;
    let mut copy = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(file(FileAction::Create, to))?;
    std::io::copy(&mut source, &mut copy)
        .and_then(|_| copy.sync_all())
        .map_err(|source| BackupError::Copy {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            source,
        })
}

/// Copies the regular files of `from` and its subdirectories (the subscription state) into
/// the new directory `to`.
fn copy_dir(from: &Path, to: &Path) -> Result<(), BackupError> {
    std::fs::create_dir_all(to).map_err(file(FileAction::Create, to))?;
    let entries = match std::fs::read_dir(from) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(file(FileAction::Read, from)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(file(FileAction::Read, from))?;
        let (path, dest) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(|source| BackupError::Path {
            path: path.clone(),
            source,
        })?;
        if kind.is_dir() {
            copy_dir(&path, &dest)?;
        } else if kind.is_file() {
            copy_new_file(&path, &dest)?;
        }
    }
    Ok(())
}
