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

use crate::ds::subscriptions::Subscriptions;

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
) -> Result<usize, String> {
    let dir = to.join(STATE_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    match subscriptions {
        Some(subscriptions) => subscriptions.back_up_to(&dir),
        None => Ok(0),
    }
}

/// The catalog copy, every object it names, then the manifest. Blocking (file and bucket
/// I/O): run it off the cores. On an error the directory stays without a manifest.
pub fn write_backup(job: &BackupJob, subscriptions: usize) -> Result<BackupSummary, String> {
    let catalog_path = job.to.join(CATALOG_FILE);
    let catalog =
        copy_sqlite_catalog(&job.db, &catalog_path).map_err(|e| format!("catalog copy: {e}"))?;
    let catalog_copied_at_ms = pico_engine::now_ms();
    let objects_dir = job.to.join(OBJECTS_DIR);
    let dest = open_file_bucket(&objects_dir)?;
    let started = Instant::now();
    let mut copied = Vec::new();
    let mut missing = Vec::new();
    let mut object_bytes: u64 = 0;
    for (key, size) in &catalog.objects {
        if Instant::now() >= job.deadline {
            return Err(format!(
                "the backup ran out of time after {} of {} objects",
                copied.len(),
                catalog.objects.len()
            ));
        }
        let bytes = match block_on(job.source.get(key)) {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(StoreError::NotFound(_))) => {
                missing.push(key.clone());
                continue;
            }
            Ok(Err(e)) => return Err(format!("reading {key}: {e}")),
            Err(_) => return Err("the node's object store is shut down".into()),
        };
        // A compaction stores its merged object under the first merged key before its catalog
        // swap: that object may be longer than this catalog copy says, and its first bytes
        // are the ones the copy names (engine `shard/compact.rs`). The copy takes those.
        let bytes = match size {
            Some(size) if bytes.len() as u64 > *size => bytes.slice(..*size as usize),
            _ => bytes,
        };
        if let Some(size) = size {
            if bytes.len() as u64 != *size {
                return Err(format!(
                    "{key} holds {} bytes where the catalog says {size}",
                    bytes.len()
                ));
            }
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
fn check_missing(catalog: &Path, missing: Vec<String>) -> Result<Vec<String>, String> {
    if missing.is_empty() {
        return Ok(missing);
    }
    let url = pico_meta::MetaUrl::SqliteFile(catalog.to_path_buf());
    let (copy, _) = MetaStore::open(&url).map_err(|e| format!("{}: {e}", catalog.display()))?;
    let garbage = block_on(copy.garbage_segments(i64::MAX));
    copy.shutdown();
    let garbage = garbage
        .map_err(|_| "the catalog copy's store stopped".to_string())?
        .map_err(|e| format!("asking the catalog copy about missing objects: {e}"))?;
    let garbage: std::collections::HashSet<String> = garbage.into_iter().collect();
    if let Some(needed) = missing.iter().find(|key| !garbage.contains(*key)) {
        return Err(format!(
            "{needed} is named by the catalog and needed by a stream, but the bucket does not \
             have it"
        ));
    }
    Ok(missing)
}

/// Sleeps as long as it takes to keep the average read rate at `max_bytes_per_second`; an
/// error when that would go past `deadline` (the backup cannot finish in its time).
fn throttle(
    started: Instant,
    bytes: u64,
    max_bytes_per_second: Option<u64>,
    deadline: Instant,
) -> Result<(), String> {
    let Some(rate) = max_bytes_per_second.filter(|r| *r > 0) else {
        return Ok(());
    };
    let wake = started + Duration::from_secs_f64(bytes as f64 / rate as f64);
    if wake > deadline {
        return Err(format!(
            "the backup ran out of time: {bytes} bytes at {rate} bytes per second take longer"
        ));
    }
    let now = Instant::now();
    if wake > now {
        std::thread::sleep(wake - now);
    }
    Ok(())
}

fn open_file_bucket(dir: &Path) -> Result<ObjectStore, String> {
    let uri = StorageUri {
        bucket_id: RESTORED_BUCKET_ID,
        location: pico_s3::StorageLocation::File(dir.to_path_buf()),
    };
    ObjectStore::open(&uri).map_err(|e| format!("cannot open {}: {e}", dir.display()))
}

fn put(store: &ObjectStore, key: &str, bytes: Bytes) -> Result<(), String> {
    match block_on(store.put(key, bytes)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing {key}: {e}")),
        Err(_) => Err(format!("writing {key}: the object store is shut down")),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every directory under `root` (and `root`) fsynced, so the names of the files in them are
/// durable before the manifest says the backup is whole.
fn sync_tree(root: &Path) -> Result<(), String> {
    let failed = |path: &Path, e: std::io::Error| format!("cannot sync {}: {e}", path.display());
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
fn write_manifest(dir: &Path, manifest: &Value) -> Result<(), String> {
    use std::io::Write;
    let path = dir.join(MANIFEST_FILE);
    let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
    let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let mut bytes = serde_json::to_vec_pretty(manifest).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    let mut file = std::fs::File::create(&tmp).map_err(failed)?;
    file.write_all(&bytes).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    std::fs::rename(&tmp, &path).map_err(failed)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(failed)
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
pub fn restore(from: &Path, target: &RestoreTarget) -> Result<RestoreSummary, String> {
    let manifest = read_manifest(from)?;
    let catalog_path = from.join(CATALOG_FILE);
    let catalog =
        read_catalog_copy(&catalog_path).map_err(|e| format!("{}: {e}", catalog_path.display()))?;
    let listed = listed_objects(&manifest)?;
    check_catalog_against_manifest(&catalog, &listed, &manifest)?;
    prepare_empty_dir(&target.dir)?;
    let source = open_file_bucket(&from.join(OBJECTS_DIR))?;
    let (dest, storage) = match &target.storage {
        Some(uri) => {
            let parsed = StorageUri::parse(uri).map_err(|e| e.to_string())?;
            let store = ObjectStore::open(&parsed).map_err(|e| format!("{uri}: {e}"))?;
            // A node's bucket holds one catalog's objects: never mix two.
            match block_on(store.list("")) {
                Ok(Ok(listed)) if listed.is_empty() => {}
                Ok(Ok(listed)) => {
                    return Err(format!(
                        "{uri} holds {} objects already; restore into an empty bucket",
                        listed.len()
                    ))
                }
                Ok(Err(e)) => return Err(format!("{uri}: {e}")),
                Err(_) => return Err(format!("{uri}: the object store is shut down")),
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
        let bytes = match block_on(source.get(key)) {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => return Err(format!("the backup's {key}: {e}")),
            Err(_) => return Err("the backup's object store is shut down".into()),
        };
        if bytes.len() as u64 != *size || sha256_hex(&bytes) != *sha256 {
            return Err(format!(
                "the backup's {key} does not match its manifest (size or SHA-256): damaged"
            ));
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
pub fn read_manifest(dir: &Path) -> Result<Value, String> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{} has no {MANIFEST_FILE}: not a complete backup (a backup writes its \
                 manifest last; this one did not finish), refused",
                dir.display()
            ))
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let manifest: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not valid JSON ({e})", path.display()))?;
    if manifest["kind"] != MANIFEST_KIND {
        return Err(format!(
            "{} is not a PicoMQ backup manifest",
            path.display()
        ));
    }
    match manifest["format"].as_u64() {
        Some(format) if (1..=MANIFEST_FORMAT).contains(&format) => Ok(manifest),
        Some(format) => Err(format!(
            "{}: backup format {format} is newer than this build reads ({MANIFEST_FORMAT})",
            path.display()
        )),
        None => Err(format!("{}: no backup format", path.display())),
    }
}

/// `(key, size, sha256)` of each object the manifest lists.
fn listed_objects(manifest: &Value) -> Result<Vec<(String, u64, String)>, String> {
    let objects = manifest["objects"]
        .as_array()
        .ok_or("the manifest lists no objects")?;
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
                _ => Err(format!("a manifest object entry is malformed: {object}")),
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
) -> Result<(), String> {
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
            return Err(format!(
                "the backup's catalog names {key}, which its manifest does not list: the \
                 catalog and the manifest are not of one backup"
            ));
        }
    }
    Ok(())
}

/// Creates `dir`, or accepts it empty; anything else is refused (a restore never mixes with
/// other files).
pub fn prepare_empty_dir(dir: &Path) -> Result<(), String> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(format!(
                    "{} is not empty; give a new or empty directory",
                    dir.display()
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))
        }
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Copies `from` to the new file `to`, readable by its owner only (the subscription state
/// holds keys), fsynced.
fn copy_new_file(from: &Path, to: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut source =
        std::fs::File::open(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    std::io::copy(&mut source, &mut file)
        .and_then(|_| file.sync_all())
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
}

/// Copies the regular files of `from` and its subdirectories (the subscription state) into
/// the new directory `to`.
fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    let entries = match std::fs::read_dir(from) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", from.display())),
    };
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", from.display()))?;
        let (path, dest) = (entry.path(), to.join(entry.file_name()));
        let kind = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if kind.is_dir() {
            copy_dir(&path, &dest)?;
        } else if kind.is_file() {
            copy_new_file(&path, &dest)?;
        }
    }
    Ok(())
}
