//! Whether `--storage` names the bucket the catalog's segments are in, checked at start before
//! recovery stores anything: the newest segments the catalog lists are looked up, and a bucket
//! holding none of them is refused, unless it holds the catalog's marker. Started on another
//! bucket (a typo in `--storage`, another endpoint, a `file://` directory that did not mount), the
//! node would answer every read of stored records with an error, store its recovered WAL files
//! and every new segment there, and leave the streams split between two buckets.
//!
//! One object found is enough: a bucket that lost some objects is damaged, not another bucket,
//! and reads report each object they miss. Segments holding only garbage are not asked for
//! (the collector deletes their objects before their rows, so a crash in between leaves rows
//! whose objects are rightly gone). A bucket that does not answer checks nothing: the node
//! starts and serves what it holds.
//!
//! A bucket that lost every segment looked up looks like an empty one. The catalog has an id
//! (made once by its schema, `catalog_identity`), and its bucket a marker named by it, so
//! that the two can be told apart:
//!
//! ```text
//! <bucket>/catalogs/<catalog id:032x>   PUT once the bucket is known to be the catalog's (its
//!                                       segments found, or none listed): catalog <id>\n
//! ```
//!
//! Markers are per catalog, so buckets shared by several catalogs stay possible. A catalog
//! without an id (its row gone) is checked by its segments alone.

use pico_meta::{MetaStore, Snapshot};
use pico_s3::{ObjectStore, StoreError};

use crate::recovery::{wait, StorageError};

/// Segments looked up, newest first: enough that a few objects gone from a right bucket never
/// look like a wrong one, few enough that a start makes only a handful of requests.
const PROBED_SEGMENTS_MAX: usize = 4;

/// Why a start was refused: the bucket holds none of the catalog's newest segments.
#[derive(Debug)]
pub struct ForeignBucket {
    pub bucket: String,
    pub segments: usize,
    pub missing: Vec<String>,
}

impl std::fmt::Display for ForeignBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bucket {} holds none of the catalog's newest segment objects ({}; the catalog lists \
             {} segments). Started on it, the node would fail every read of stored records and \
             store new segments apart from the old ones. Is --storage the bucket this catalog's \
             node stored to (its endpoint, name or directory), and is its volume mounted? Start \
             with that bucket; or, if its objects are lost, start with --wal-salvage \
             (PICO_WAL_SALVAGE=1), which reports the loss. Nothing was changed",
            self.bucket,
            self.missing.join(", "),
            self.segments,
        )
    }
}

impl ForeignBucket {
    /// The loss `--wal-salvage` started past, for the log and `/ready`.
    pub(crate) fn salvaged(&self) -> String {
        format!(
            "salvaged past a bucket that lacks the catalog's segments: bucket {} holds none of \
             the catalog's newest segment objects ({}); reads of the records in each segment it \
             lacks fail until the object is restored",
            self.bucket,
            self.missing.join(", "),
        )
    }
}

impl std::error::Error for ForeignBucket {}

/// What the check found.
#[derive(Debug)]
pub(crate) enum BucketCheck {
    /// The bucket holds a segment the catalog lists, or the catalog lists none worth asking for.
    Holds,
    /// The bucket holds the catalog's marker but none of these segments: it lost them, and
    /// reads of their records fail until they are restored.
    Lost(Vec<String>),
    /// The bucket could not be asked; the node starts on it.
    Unanswered(StorageError),
    /// None of the segments asked for is in the bucket, nor the catalog's marker.
    Foreign(ForeignBucket),
}

/// Looks the catalog's newest segments up in `store`: at most [`PROBED_SEGMENTS_MAX`], then,
/// when none is there, the newest that hold more than garbage, then the catalog's marker. A
/// bucket found to be the catalog's gets the marker if it lacks it.
pub(crate) fn check_bucket(
    meta: &MetaStore,
    store: &ObjectStore,
    snapshot: &Snapshot,
) -> BucketCheck {
    let missing = match probe(meta, store, snapshot) {
        Ok(missing) => missing,
        Err(e) => return BucketCheck::Unanswered(e),
    };
    let Some(id) = &snapshot.catalog_id else {
        return match missing {
            None => BucketCheck::Holds,
            Some(missing) => BucketCheck::Foreign(foreign(store, snapshot, missing)),
        };
    };
    let marker = marker_key(id);
    let marked = match present(store, &marker) {
        Ok(marked) => marked,
        Err(e) => return BucketCheck::Unanswered(e),
    };
    match (missing, marked) {
        (None, true) => BucketCheck::Holds,
        (None, false) => {
            let text = format!("catalog {id}\n");
            if let Err(e) = wait(store.put(&marker, text.into())) {
                log::warn!("cannot store the catalog's marker {marker} in the bucket: {e}");
            }
            BucketCheck::Holds
        }
        (Some(missing), true) => BucketCheck::Lost(missing),
        (Some(missing), false) => BucketCheck::Foreign(foreign(store, snapshot, missing)),
    }
}

fn foreign(store: &ObjectStore, snapshot: &Snapshot, missing: Vec<String>) -> ForeignBucket {
    ForeignBucket {
        bucket: store.uri().to_string(),
        segments: snapshot.segments.len(),
        missing,
    }
}

/// The bucket object that says the bucket is this catalog's.
fn marker_key(catalog_id: &str) -> String {
    format!("catalogs/{catalog_id}")
}

/// The keys asked for and missing, or `None` once one is found (or none is worth asking for).
fn probe(
    meta: &MetaStore,
    store: &ObjectStore,
    snapshot: &Snapshot,
) -> Result<Option<Vec<String>>, StorageError> {
    let newest: Vec<&str> = newest_keys(snapshot, |_| true);
    if newest.is_empty() {
        return Ok(None);
    }
    let mut missing = Vec::new();
    for key in &newest {
        if present(store, key)? {
            return Ok(None);
        }
        missing.push(key.to_string());
    }
    // Every one missing: leave out what only garbage lies in, and ask for the newest of the
    // rest (the collector may have deleted garbage objects, or be deleting them on another node
    // of the cluster).
    let garbage: std::collections::HashSet<String> =
        wait(meta.garbage_segments(i64::MAX))?.into_iter().collect();
    let live = newest_keys(snapshot, |key| !garbage.contains(key));
    missing.retain(|key| !garbage.contains(key));
    for key in live {
        if missing.iter().any(|m| m == key) {
            continue;
        }
        if present(store, key)? {
            return Ok(None);
        }
        missing.push(key.to_string());
    }
    Ok((!missing.is_empty()).then_some(missing))
}

/// The keys of the newest segments `keep` accepts, newest first (the snapshot lists segments
/// in commit order).
fn newest_keys(snapshot: &Snapshot, keep: impl Fn(&str) -> bool) -> Vec<&str> {
    snapshot
        .segments
        .iter()
        .rev()
        .map(|segment| segment.key.as_str())
        .filter(|key| keep(key))
        .take(PROBED_SEGMENTS_MAX)
        .collect()
}

/// Whether `key` is in the bucket: its first byte read (a read of an object just written finds
/// it on every S3-compatible store, where a listing may lag). Any error but "not found" (a
/// missing bucket's included) is no answer.
fn present(store: &ObjectStore, key: &str) -> Result<bool, StorageError> {
    match wait(store.get_range(key, 0, 1)) {
        Ok(_) | Err(StorageError::Store(StoreError::Short { .. })) => Ok(true),
        Err(StorageError::Store(StoreError::NotFound(_))) => Ok(false),
        Err(e) => Err(e),
    }
}
