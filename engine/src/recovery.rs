//! Recovery of the WAL files a previous run left (whatever its core count): each file's
//! committed rounds are stored as a segment object and indexed in the catalog, then the file
//! is removed. A torn last round was never acknowledged and is dropped; damage before
//! acknowledged data stops the node (or, with `--wal-salvage`, is salvaged and written down).
//! Runs on the main thread before any core starts (see `boot`). The format and the rules that
//! tell a torn end from damage: `wal_file.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use futures_channel::oneshot;
use pico_meta::{
    MetaError, MetaStore, ProducerState, SegmentRecord, SegmentRun, SegmentStreamEntry, Snapshot,
};
use pico_s3::{ObjectStore, StoreError};

use crate::clock::Clock;
use crate::config::EngineConfig;
use crate::frame::{self, FRAME_KIND_CLOSE, FRAME_KIND_RECORD};
use crate::placement::{epoch_of, segment_keys};
use crate::wal_file::{self, Damage, ScanError, WalEnd};
use crate::wal_ledger::{self, MissingFile};

mod deferred;
mod salvage;

pub use deferred::RecoveryBacklog;
pub(crate) use deferred::{store_in_background, DeferredSegment};
use salvage::{Gap, Lost, Tails};

/// Where damaged WAL files are kept for an operator, under the WAL directory.
pub const DAMAGED_WAL_DIR: &str = "damaged";

/// Why the WAL files could not be recovered: the node does not start.
#[derive(Debug)]
pub enum RecoveryError {
    /// The WAL directory could not be listed.
    ListDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// A WAL file could not be read.
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A WAL file of a format this build does not read.
    Format { path: PathBuf, source: ScanError },
    /// A WAL file is damaged before acknowledged data and `--wal-salvage` is off: `report`
    /// says what the file holds.
    Damaged { report: String, wal_dir: PathBuf },
    /// WAL files a core's ledger lists are gone and `--wal-salvage` is off: `report` names
    /// them.
    Missing { report: String, wal_dir: PathBuf },
    /// A WAL file holds records of a stream id the catalog never handed out: it was written
    /// with another catalog.
    ForeignCatalog {
        path: PathBuf,
        stream_id: u64,
        reached: u64,
    },
    /// A recovered WAL file could not be removed.
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A damaged WAL file is to be salvaged while the bucket does not take writes: a salvage
    /// is stored before its file is moved aside, so it waits for the bucket.
    SalvageNeedsBucket { path: PathBuf, why: String },
    /// A damaged WAL file could not be moved aside with its report (`action` failed in
    /// `dir`).
    KeepDamaged {
        action: &'static str,
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The metadata log or the object store failed.
    Storage(StorageError),
}

impl std::fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryError::ListDir { dir, source } => {
                write!(f, "cannot list WAL directory {}: {source}", dir.display())
            }
            RecoveryError::Read { path, source } => {
                write!(f, "cannot read WAL file {}: {source}", path.display())
            }
            RecoveryError::Format { path, source } => {
                write!(f, "WAL file {}: {source}", path.display())
            }
            RecoveryError::Damaged { report, wal_dir } => write!(
                f,
                "{report}\nThe node does not start on a damaged WAL: acknowledged records would \
                 be lost and their offsets handed out again. Keep a copy of {dir}, then start \
                 with --wal-salvage (PICO_WAL_SALVAGE=1) to keep what can be read in order, \
                 close each stream that lost records at its first lost offset, and move the \
                 file to {dir}/{DAMAGED_WAL_DIR}/ with a report of what was lost \
                 (docs/durability.md, \"Damaged WAL files\").",
                dir = wal_dir.display()
            ),
            RecoveryError::Missing { report, wal_dir } => write!(
                f,
                "{report}\nThe node does not start with WAL files missing: acknowledged \
                 records would be lost and their offsets handed out again. Put the files back \
                 (is the volume of {dir} mounted? did --wal-dir change?) and start again. To go \
                 on without them, start with --wal-salvage (PICO_WAL_SALVAGE=1): the node \
                 starts from the catalog and the other WAL files, closes each stream whose \
                 records in a later file show the gap, and reports the loss \
                 (docs/durability.md, \"Missing WAL files\").",
                dir = wal_dir.display()
            ),
            RecoveryError::ForeignCatalog {
                path,
                stream_id,
                reached,
            } => write!(
                f,
                "WAL file {} holds acknowledged records of stream id {stream_id}, but the \
                 catalog (--meta-url) never handed out a stream id above {reached}: it is not \
                 the catalog this node ran with (a wrong --meta-url, or a new or older copy of \
                 it). Started on it, the node would drop those records and hand their offsets \
                 out again. Start with the catalog this node used; nothing was changed",
                path.display()
            ),
            RecoveryError::Remove { path, source } => {
                write!(f, "cannot remove WAL file {}: {source}", path.display())
            }
            RecoveryError::SalvageNeedsBucket { path, why } => write!(
                f,
                "cannot salvage damaged WAL file {}: the bucket does not take writes ({why}). \
                 A salvage is stored in the bucket before the file is moved aside; start \
                 again once the bucket takes writes (nothing was changed)",
                path.display()
            ),
            RecoveryError::KeepDamaged {
                action,
                dir,
                source,
            } => write!(f, "cannot {action} in {}: {source}", dir.display()),
            RecoveryError::Storage(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RecoveryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecoveryError::ListDir { source, .. }
            | RecoveryError::Read { source, .. }
            | RecoveryError::Remove { source, .. }
            | RecoveryError::KeepDamaged { source, .. } => Some(source),
            RecoveryError::Format { source, .. } => Some(source),
            RecoveryError::Storage(e) => Some(e),
            RecoveryError::Damaged { .. }
            | RecoveryError::Missing { .. }
            | RecoveryError::ForeignCatalog { .. }
            | RecoveryError::SalvageNeedsBucket { .. } => None,
        }
    }
}

impl From<StorageError> for RecoveryError {
    fn from(e: StorageError) -> RecoveryError {
        RecoveryError::Storage(e)
    }
}

/// A metadata or object-store call made before the cores start, which failed.
#[derive(Debug)]
pub enum StorageError {
    /// The storage thread stopped before it answered.
    Stopped,
    Meta(MetaError),
    Store(StoreError),
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::Stopped => f.write_str("storage thread stopped during recovery"),
            StorageError::Meta(e) => e.fmt(f),
            StorageError::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StorageError::Stopped => None,
            StorageError::Meta(e) => Some(e),
            StorageError::Store(e) => Some(e),
        }
    }
}

impl From<MetaError> for StorageError {
    fn from(e: MetaError) -> StorageError {
        StorageError::Meta(e)
    }
}

impl From<StoreError> for StorageError {
    fn from(e: StoreError) -> StorageError {
        StorageError::Store(e)
    }
}

/// What recovery learned that the rest of boot needs.
pub(crate) struct Recovered {
    /// The newest node epoch any WAL file or segment was named with: this run names its
    /// files above it.
    pub(crate) max_epoch_ms: u64,
    /// One line per damaged WAL file this boot salvaged: the file, where it was kept and what
    /// each stream lost (for `/ready`, `/metrics` and the log).
    pub(crate) salvaged: Vec<String>,
    /// The node epochs of the WAL files found (earlier incarnations of this node).
    pub(crate) wal_epochs: Vec<u64>,
    /// The files whose segment the bucket did not take, in file order: stored by a thread
    /// of their own once the node serves (`deferred.rs`).
    pub(crate) deferred: Vec<DeferredSegment>,
}

/// Turns every WAL file into a committed segment: its committed rounds are stored as an object
/// and indexed in the catalog, then the file is removed. Idempotent: a crash midway redoes the
/// same keys, and a file whose segment the catalog already has is only removed (the object is
/// the copy that counts; a damaged leftover never replaces it).
///
/// When the bucket refuses a segment, that file and every later one are deferred: indexed in
/// `snapshot` (the cores serve them) but stored later, in order, by `store_in_background`.
pub(crate) fn recover_wal_files(
    config: &EngineConfig,
    meta: &MetaStore,
    store: &ObjectStore,
    snapshot: &mut Snapshot,
    report: &mut Vec<String>,
    fence: Option<(pico_meta::NodeId, u64)>,
    clock: &Clock,
) -> Result<Recovered, RecoveryError> {
    let mut max_epoch_ms = snapshot
        .segments
        .iter()
        .filter_map(|s| epoch_of(s.key.rsplit('/').next().unwrap_or_default()))
        .max()
        .unwrap_or(0);
    let list_failed = |source| RecoveryError::ListDir {
        dir: config.wal_dir.clone(),
        source,
    };
    let files = wal_files(&config.wal_dir).map_err(list_failed)?;
    if let Some(reached) = snapshot.stream_ids_reached {
        check_catalog_reach(&files, reached)?;
    }
    let ledgers = wal_ledger::ledgers(&config.wal_dir).map_err(list_failed)?;
    let mut salvaged = Vec::new();
    let missing = wal_ledger::missing_files(&config.wal_dir, &ledgers, &files);
    if !missing.is_empty() {
        let described = describe_missing(&missing);
        if !config.wal_salvage {
            return Err(RecoveryError::Missing {
                report: described,
                wal_dir: config.wal_dir.clone(),
            });
        }
        // Salvaged past: their ledgers go, or the next start would refuse again.
        for file in &missing {
            wal_ledger::unlist(&file.path).map_err(|source| RecoveryError::Remove {
                path: file.ledger.clone(),
                source,
            })?;
        }
        let line = format!("salvaged past missing WAL files: {described}");
        log::error!("{line}");
        report.push(line.clone());
        salvaged.push(line);
    }
    let committed: HashSet<String> = snapshot.segments.iter().map(|s| s.key.clone()).collect();
    // Every stream's tail and name, read from the catalog only once a file with records needs
    // them (a clean stop leaves no such file, so its start does not walk every stream).
    let mut tails: Option<Tails> = None;
    let mut wal_epochs = Vec::new();
    let mut deferred: Vec<DeferredSegment> = Vec::new();
    // The `<epoch>-<core>` of each file: a core's files are made one after another, each
    // pre-allocated before the next is made.
    let core_of = |path: &Path| -> Option<String> {
        let stem = path.file_stem()?.to_str()?;
        Some(stem.get(..stem.rfind('-')?)?.to_string())
    };
    let newest_of_core: HashMap<String, PathBuf> = files
        .iter()
        .filter_map(|path| Some((core_of(path)?, path.clone())))
        .collect();
    for path in files {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        max_epoch_ms = max_epoch_ms.max(epoch_of(&stem).unwrap_or(0));
        wal_epochs.extend(epoch_of(&stem));
        let data = std::fs::read(&path).map_err(|source| RecoveryError::Read {
            path: path.clone(),
            source,
        })?;
        let mut scanned = wal_file::scan(&data).map_err(|source| RecoveryError::Format {
            path: path.clone(),
            source,
        })?;
        // Empty, yet its core made a file after it: it was pre-allocated before that one was
        // made, so it was cut to nothing after it was written.
        let later_of_its_core = core_of(&path)
            .and_then(|core| newest_of_core.get(&core))
            .is_some_and(|newest| *newest != path);
        if data.is_empty() && later_of_its_core {
            scanned.end = WalEnd::Damaged(wal_file::Damage {
                at: 0,
                resumes_at: None,
                why: "the file is empty, yet its core made a later WAL file, which it does only \
                      once this one was pre-allocated: it was cut to nothing after it was \
                      written, and the streams whose records it held cannot be named"
                    .to_string(),
                claimed: None,
                commit_record_only: false,
                cut: true,
                before: Vec::new(),
                after: Vec::new(),
            });
        }
        let mut keys = segment_keys(config.catalog_id.as_deref(), config.node_id, &stem);
        if let Some(key) = keys.iter().find(|key| committed.contains(*key)) {
            // Stored and committed before the crash, which came before the file's removal.
            if let WalEnd::Damaged(damage) = &scanned.end {
                let tails = tails.get_or_insert_with(|| Tails::new(snapshot));
                let kept = keep_damaged(config, &path, &describe(&path, damage, tails))?;
                log::warn!(
                    "WAL file {} is damaged, but its segment {key} was stored before the \
                     crash: nothing is lost; the file was moved to {}",
                    path.display(),
                    kept.display()
                );
            } else {
                remove(&path)?;
            }
            report.push(format!(
                "WAL file {} was already stored as {key}",
                path.display()
            ));
            continue;
        }
        // Stored now under this build's key (an object a crash left under the earlier one is
        // the sweep's).
        let key = keys.swap_remove(0);
        // A single node's streams go on from the catalog's tails without a gap; one that skips
        // offsets lost them with a WAL file that is gone. (A cluster's streams move between
        // nodes: their frames are fenced by owner epoch instead.)
        let intact = !matches!(scanned.end, WalEnd::Damaged(_));
        let gaps = if intact && fence.is_none() && !scanned.committed.is_empty() {
            tails
                .get_or_insert_with(|| Tails::new(snapshot))
                .gaps(&scanned.committed)
        } else {
            Vec::new()
        };
        let (bytes, damaged) = match &scanned.end {
            WalEnd::Damaged(damage) => {
                let tails = tails.get_or_insert_with(|| Tails::new(snapshot));
                let described = describe(&path, damage, tails);
                if !config.wal_salvage {
                    return Err(RecoveryError::Damaged {
                        report: described,
                        wal_dir: config.wal_dir.clone(),
                    });
                }
                let (bytes, lost) = tails.salvage(&data, damage, clock.now_ms());
                (bytes, Some((described, damage.commit_record_only, lost)))
            }
            _ if !gaps.is_empty() => {
                let tails = tails.as_mut().expect("made for the gaps");
                let described = describe_gaps(&path, &gaps, tails);
                if !config.wal_salvage {
                    return Err(RecoveryError::Damaged {
                        report: described,
                        wal_dir: config.wal_dir.clone(),
                    });
                }
                let (bytes, lost) =
                    tails.salvage_gaps(&data, &scanned.committed, &gaps, clock.now_ms());
                (bytes, Some((described, false, lost)))
            }
            _ => {
                // The whole rounds as they are (what the running core would have stored),
                // unless a salvage of an earlier file closed one of their streams: then their
                // frames without that stream's.
                let bytes = match tails.as_mut() {
                    None => scanned.segment_bytes(&data).to_vec(),
                    Some(tails) => match tails.kept(&data, &scanned.committed) {
                        (_, true) => scanned.segment_bytes(&data).to_vec(),
                        (kept, false) => kept,
                    },
                };
                (bytes, None)
            }
        };
        if let WalEnd::Torn { dropped } = scanned.end {
            report.push(format!(
                "WAL file {}: {dropped} bytes of a write the crash cut (never acknowledged) \
                 dropped",
                path.display()
            ));
        }
        let mut kept_for_later = false;
        if !bytes.is_empty() {
            let bytes = bytes::Bytes::from(bytes);
            let record = index_segment(key, &bytes, clock.now_ms());
            // Once one file waits for the bucket, every later one waits behind it: the
            // catalog takes each stream's records in offset order.
            let refused = match (deferred.last(), store.unreachable_at_open()) {
                (Some(first), _) => Some(format!("{} waits before it", first.path.display())),
                (None, Some(why)) => Some(format!("the bucket could not be reached: {why}")),
                (None, None) => match wait(store.put(&record.key, bytes.clone())) {
                    Ok(()) => None,
                    Err(StorageError::Store(e)) => Some(e.to_string()),
                    Err(e) => return Err(e.into()),
                },
            };
            match refused {
                None => {
                    commit(meta, &record, fence, &scanned.epochs, &path)?;
                    report.push(format!(
                        "recovered WAL file {} ({} bytes, format {})",
                        path.display(),
                        bytes.len(),
                        scanned.version
                    ));
                }
                Some(why) if damaged.is_some() => {
                    return Err(RecoveryError::SalvageNeedsBucket { path, why });
                }
                Some(why) => {
                    log::warn!(
                        "WAL file {}: the bucket did not take its segment {} ({why}); its \
                         records are served from memory and stored once the bucket takes \
                         writes, before anything newer",
                        path.display(),
                        record.key
                    );
                    report.push(format!(
                        "recovered WAL file {} ({} bytes, format {}); not yet stored",
                        path.display(),
                        bytes.len(),
                        scanned.version
                    ));
                    deferred.push(DeferredSegment {
                        path: path.clone(),
                        record: record.clone(),
                        bytes,
                        epochs: scanned.epochs.clone(),
                    });
                    kept_for_later = true;
                }
            }
            snapshot.segments.retain(|s| s.key != record.key);
            snapshot.segments.push(record);
        }
        match damaged {
            None if kept_for_later => {}
            None => remove(&path)?,
            Some((described, commit_record_only, lost)) => {
                let tails = tails.as_ref().expect("made for the damaged file");
                let summary = lost_summary(commit_record_only, &lost, tails);
                let text = salvage_report(&described, &summary, clock.now_ms());
                let kept = keep_damaged(config, &path, &text)?;
                let line = format!(
                    "salvaged damaged WAL file {} (kept as {}): {}",
                    path.display(),
                    kept.display(),
                    summary
                );
                log::error!("{line}");
                report.push(line.clone());
                salvaged.push(line);
            }
        }
    }
    // The ledgers of files all stored are gone with their first file; what is left lists
    // nothing or waits for the bucket with its deferred files.
    for (group, ledger) in &ledgers {
        let waiting = deferred
            .iter()
            .any(|d| wal_ledger::group_and_counter(&d.path).is_some_and(|(g, _)| g == group));
        if !waiting {
            wal_ledger::forget(&config.wal_dir, group).map_err(|source| RecoveryError::Remove {
                path: ledger.path.clone(),
                source,
            })?;
        }
    }
    wal_epochs.sort_unstable();
    wal_epochs.dedup();
    Ok(Recovered {
        max_epoch_ms,
        salvaged,
        wal_epochs,
        deferred,
    })
}

/// The WAL files (`*.wal`) in `dir`, sorted by name: each core's in the order it made them.
pub(crate) fn wal_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
        .collect();
    files.sort();
    Ok(files)
}

/// Deletes the segment objects that earlier incarnations of this node stored but never got
/// into the catalog (a crash between an object's PUT and its catalog commit), once recovery
/// is done. Only under this node's key prefix and only for the epochs known to be this node's
/// (its WAL files', and the newest in the catalog under its prefix): nothing else writes there,
/// and an earlier incarnation can no longer commit (its WAL is recovered; in a cluster its
/// node epoch is superseded, so its commits are refused). Listing by epoch prefix keeps this
/// to a few small listings at start-up, however large the bucket. Returns how many went.
///
/// Only an incarnation the catalog holds committed segments of is swept: an object unknown to
/// a catalog that holds nothing of its incarnation proves no crash, only that this is not the
/// catalog it committed to (a wrong `--meta-url`, a new file); deleting there would destroy
/// that incarnation's stored records. Its objects stay, with a warning; a crash's leftovers
/// of an incarnation that committed nothing cost space, not data.
pub(crate) fn sweep_orphans(
    config: &EngineConfig,
    meta: &MetaStore,
    store: &ObjectStore,
    snapshot: &Snapshot,
    wal_epochs: &[u64],
) -> Result<usize, StorageError> {
    let committed: HashSet<&str> = snapshot.segments.iter().map(|s| s.key.as_str()).collect();
    let mut removed = 0;
    // This build's key prefix, then the one before schema 15 (runs of an earlier build).
    for layout in segment_keys(config.catalog_id.as_deref(), config.node_id, "") {
        let prefix = layout.trim_end_matches(".seg");
        removed += sweep_prefix(
            config, meta, store, snapshot, &committed, prefix, wal_epochs,
        )?;
    }
    Ok(removed)
}

/// [`sweep_orphans`] under one key prefix (`segments/.../`).
fn sweep_prefix(
    config: &EngineConfig,
    meta: &MetaStore,
    store: &ObjectStore,
    snapshot: &Snapshot,
    committed: &HashSet<&str>,
    prefix: &str,
    wal_epochs: &[u64],
) -> Result<usize, StorageError> {
    let committed_epochs: HashSet<u64> = snapshot
        .segments
        .iter()
        .filter_map(|s| s.key.strip_prefix(prefix))
        .filter(|rest| !rest.contains('/'))
        .filter_map(epoch_of)
        .collect();
    let newest_committed = committed_epochs.iter().max().copied();
    let mut epochs: Vec<u64> = wal_epochs.iter().copied().chain(newest_committed).collect();
    epochs.sort_unstable();
    epochs.dedup();
    let mut removed = 0;
    for epoch in epochs.into_iter().filter(|e| *e < config.node_epoch_ms) {
        let listed = wait(store.list(&format!("{prefix}{epoch:016}-")))?;
        let unknown: Vec<String> = listed
            .into_iter()
            .map(|(key, _)| key)
            .filter(|key| key.ends_with(".seg") && !committed.contains(key.as_str()))
            .collect();
        if unknown.is_empty() {
            continue;
        }
        if !committed_epochs.contains(&epoch) {
            log::warn!(
                "{} segment objects of this node's run {epoch} (its WAL files are here) are in \
                 no catalog row, and the catalog holds nothing of that run: left in place. Is \
                 --meta-url the catalog this node ran with?",
                unknown.len()
            );
            continue;
        }
        // Asked again now: the snapshot was read before this incarnation registered, and an
        // earlier one may have committed in between.
        let late: HashSet<String> = wait(meta.committed_segments(unknown.clone()))?
            .into_iter()
            .collect();
        for key in unknown.iter().filter(|key| !late.contains(*key)) {
            wait(store.delete(key))?;
            log::info!("deleted segment object {key}: stored by an earlier run, never committed");
            removed += 1;
        }
    }
    Ok(removed)
}

/// Commits a recovered segment; in a cluster, fenced by this node incarnation's ownership at
/// the owner epochs the WAL file names.
fn commit(
    meta: &MetaStore,
    record: &SegmentRecord,
    fence: Option<(pico_meta::NodeId, u64)>,
    epochs: &HashMap<u64, u64>,
    path: &Path,
) -> Result<(), StorageError> {
    let Some((node, node_epoch)) = fence else {
        return wait(meta.commit_segment(record.clone()));
    };
    // The owner epochs the file's frames were written at (format 2): a stream that moved away
    // and came back while this node was down is held at a newer epoch, and these frames are
    // not that incarnation's. A format-1 file has none, and is fenced by node alone.
    let fence = pico_meta::SegmentFence {
        node,
        node_epoch,
        epochs: epochs.clone(),
        quarantine_refused: true,
    };
    let fenced = wait(meta.commit_segment_fenced(record.clone(), fence))?;
    for id in fenced {
        // Data this node wrote before another node took the stream over: the new owner has
        // served the stream since, so these records cannot join it.
        let entry = record.streams.iter().find(|e| e.stream_id == id);
        let runs = entry.map(|e| format!("{:?}", e.runs)).unwrap_or_default();
        log::error!(
            "WAL file {}: stream {id} was taken over by another node while this node was down; \
             its records {runs} in object {} were not restored",
            path.display(),
            record.key
        );
    }
    Ok(())
}

/// Refuses WAL files written with another catalog, before recovery changes anything: a frame
/// of a stream id above the highest the catalog ever handed out (ids only grow, deleted
/// streams' included). Recovered into this catalog, such records would be dropped as a deleted
/// stream's and their files removed, and the sweep would then take their incarnation's objects
/// for a crash's leftovers. Files that do not scan are left to the recovery that follows.
fn check_catalog_reach(files: &[PathBuf], reached: u64) -> Result<(), RecoveryError> {
    for path in files {
        let data = std::fs::read(path).map_err(|source| RecoveryError::Read {
            path: path.clone(),
            source,
        })?;
        let Ok(scanned) = wal_file::scan(&data) else {
            continue;
        };
        if let Some(stream_id) = scanned.committed.iter().map(|f| f.stream_id).max() {
            if stream_id > reached {
                return Err(RecoveryError::ForeignCatalog {
                    path: path.clone(),
                    stream_id,
                    reached,
                });
            }
        }
    }
    Ok(())
}

/// Removes a recovered WAL file, its core's ledger first (`wal_ledger.rs`).
fn remove(path: &Path) -> Result<(), RecoveryError> {
    let failed = |source| RecoveryError::Remove {
        path: path.to_path_buf(),
        source,
    };
    wal_ledger::unlist(path).map_err(failed)?;
    std::fs::remove_file(path).map_err(failed)
}

/// What the missing WAL files were, for the error that stops the node and the salvage line.
fn describe_missing(missing: &[MissingFile]) -> String {
    let names: Vec<String> = missing
        .iter()
        .map(|file| {
            format!(
                "{} (listed in {})",
                file.path.display(),
                file.ledger.display()
            )
        })
        .collect();
    format!(
        "WAL files missing: {}. A core's ledger lists each WAL file it made until the file's \
         segment is stored: each of these held acknowledged records of streams that cannot be \
         named, or was the core's next file, ready for them.",
        names.join(", ")
    )
}

/// What a damaged file holds, for the error that stops the node and for the salvage report.
fn describe(path: &Path, damage: &Damage, tails: &Tails) -> String {
    let mut text = format!(
        "WAL file {} is damaged at byte {}: {}.",
        path.display(),
        damage.at,
        damage.why
    );
    match damage.resumes_at {
        Some(next) => text.push_str(&format!(
            " Bytes {}..{next} cannot be read; valid frames resume at byte {next}.",
            damage.at
        )),
        None => text.push_str(" Nothing past it can be read."),
    }
    if let Some((stream_id, offset)) = damage.claimed {
        text.push_str(&format!(
            " The damaged frame's header names stream {} offset {offset}.",
            tails.name(stream_id)
        ));
    }
    if damage.commit_record_only {
        text.push_str(" The damaged bytes are one commit record, with no record in them.");
    }
    let mut after: BTreeMap<u64, (u64, u64, usize)> = BTreeMap::new();
    for frame in &damage.after {
        let seen = after
            .entry(frame.stream_id)
            .or_insert((frame.offset, frame.offset, 0));
        seen.0 = seen.0.min(frame.offset);
        seen.1 = seen.1.max(frame.offset);
        seen.2 += 1;
    }
    for (id, (first, last, count)) in after {
        text.push_str(&format!(
            "\n  past the damage: stream {} has {count} acknowledged frames at offsets \
             {first}..={last}",
            tails.name(id)
        ));
    }
    text
}

/// What an intact file whose records skip offsets lost, for the error that stops the node and
/// for the salvage report.
fn describe_gaps(path: &Path, gaps: &[Gap], tails: &Tails) -> String {
    let mut text = format!(
        "WAL file {} reads whole, but its records skip offsets: the records in between were \
         acknowledged in a WAL file that is gone (deleted, or lost with part of the disk).",
        path.display()
    );
    for gap in gaps {
        text.push_str(&format!(
            "\n  stream {} goes on at offset {}, while the catalog and the WAL files before \
             this one end at {}: offsets {}..={} are lost",
            tails.name(gap.stream_id),
            gap.found,
            gap.expected,
            gap.expected,
            gap.found - 1
        ));
    }
    text
}

/// What each stream lost, in one line; `commit_record_only`: the damaged bytes were one commit
/// record.
fn lost_summary(commit_record_only: bool, lost: &BTreeMap<u64, Lost>, tails: &Tails) -> String {
    if lost.is_empty() && commit_record_only {
        return "the damaged bytes held one commit record and no record: every acknowledged \
                record was restored"
            .into();
    }
    if lost.is_empty() {
        return "no stream lost records that could be named (the damaged bytes named no stream)"
            .into();
    }
    lost.iter()
        .map(|(id, lost)| {
            let to = lost
                .seen_to
                .map_or("?".to_string(), |to| format!("{}", to.saturating_sub(1)));
            format!(
                "stream {} lost offsets {}..={to} and was closed at {}",
                tails.name(*id),
                lost.from,
                lost.from
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn salvage_report(described: &str, summary: &str, now_ms: i64) -> String {
    format!(
        "{described}\n\nSalvaged at {now_ms} ms since the epoch: every frame readable in order \
         was restored; {summary}. A '?' upper bound means the damaged bytes held the stream's \
         last records and how many cannot be known. A stream whose records the damaged bytes \
         held but whose header was destroyed cannot be named; the byte range above is what was \
         lost.\n"
    )
}

/// Moves a damaged WAL file out of recovery's way into `<wal dir>/damaged/`, with `report`
/// beside it (`<file>.txt`); both made durable. Returns where the file went.
fn keep_damaged(
    config: &EngineConfig,
    path: &Path,
    report: &str,
) -> Result<PathBuf, RecoveryError> {
    let dir = config.wal_dir.join(DAMAGED_WAL_DIR);
    let failed = |action: &'static str, source: std::io::Error| RecoveryError::KeepDamaged {
        action,
        dir: dir.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(|e| failed("create the directory", e))?;
    let name = path.file_name().unwrap_or_default();
    let kept = dir.join(name);
    let mut report_path = kept.clone().into_os_string();
    report_path.push(".txt");
    std::fs::write(&report_path, report).map_err(|e| failed("write the report", e))?;
    wal_ledger::unlist(path).map_err(|e| failed("remove the file's WAL ledger", e))?;
    std::fs::File::open(&report_path)
        .and_then(|f| f.sync_all())
        .map_err(|e| failed("sync the report", e))?;
    std::fs::rename(path, &kept).map_err(|e| failed("move the damaged WAL file", e))?;
    for dir in [&dir, &config.wal_dir] {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| failed("sync the directory", e))?;
    }
    Ok(kept)
}

/// Blocks on a metadata or object-store answer (boot runs before any executor).
pub(crate) fn wait<T, E: Into<StorageError>>(
    reply: oneshot::Receiver<Result<T, E>>,
) -> Result<T, StorageError> {
    futures_lite::future::block_on(reply)
        .map_err(|_| StorageError::Stopped)?
        .map_err(Into::into)
}

/// Builds a segment's catalog entry from its frames, made at `created_ms`.
pub(crate) fn index_segment(key: String, bytes: &bytes::Bytes, created_ms: i64) -> SegmentRecord {
    let mut entries: std::collections::BTreeMap<u64, SegmentStreamEntry> = Default::default();
    let mut pos = 0;
    while let Ok((frame, len)) = frame::decode_frame(bytes, pos) {
        // A WAL's commit and epoch records are no stream's.
        if frame.kind != FRAME_KIND_RECORD && frame.kind != FRAME_KIND_CLOSE {
            pos += len;
            continue;
        }
        let entry = entries
            .entry(frame.stream_id)
            .or_insert_with(|| SegmentStreamEntry {
                stream_id: frame.stream_id,
                runs: Vec::new(),
                last_timestamp_ms: 0,
                closed: false,
                producers: Vec::new(),
                closed_by: None,
                writer_seq: None,
            });
        entry.last_timestamp_ms = entry.last_timestamp_ms.max(frame.timestamp_ms);
        if let Some(writer_seq) = &frame.writer_seq {
            entry.writer_seq = entry.writer_seq.clone().max(Some(writer_seq.clone()));
        }
        if let Some(producer) = &frame.producer {
            let state = ProducerState {
                id: producer.id.clone(),
                epoch: producer.epoch,
                seq: producer.seq,
            };
            match entry.producers.iter_mut().find(|p| p.id == producer.id) {
                Some(known) => *known = known.clone().max(state.clone()),
                None => entry.producers.push(state.clone()),
            }
            if frame.kind == FRAME_KIND_CLOSE {
                entry.closed_by = Some(state);
            }
        }
        if frame.kind == FRAME_KIND_CLOSE {
            entry.closed = true;
        } else {
            let run = SegmentRun {
                first_offset: frame.offset,
                next_offset: frame.offset + 1,
                byte_start: pos as u64,
                byte_end: (pos + len) as u64,
            };
            if !entry.runs.last_mut().is_some_and(|last| last.extend(&run)) {
                entry.runs.push(run);
            }
        }
        pos += len;
    }
    for entry in entries.values_mut() {
        entry.producers.sort();
        // The same spans as a segment sealed by a running core (see `coarsen_runs`).
        crate::shard::coarsen_runs(&mut entry.runs);
    }
    SegmentRecord {
        key,
        size_bytes: pos as u64,
        created_ms,
        streams: entries.into_values().collect(),
    }
}

#[cfg(test)]
mod tests;
