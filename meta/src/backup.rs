//! A consistent copy of a SQLite catalog taken while the node writes to it, and what such a
//! copy names (docs/backup.md).
//!
//! The copy is SQLite's `VACUUM INTO` run on a connection of its own: one read transaction,
//! so the copy is the catalog as of one commit, whatever the node's metadata thread commits
//! meanwhile (the database is in WAL journal mode: the reader never blocks the writer). A
//! file copy of a live database could tear a page between two commits; this cannot.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use crate::limits::SQLITE_BUSY_TIMEOUT_SECS;
use crate::schema::storage;
use crate::MetaError;

/// What a catalog copy holds: the objects it names and each stream's extent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatalogCopy {
    /// The schema version of the copy (`schema_version`'s highest row).
    pub schema_version: i64,
    /// Every object the copy names (committed segments, then quarantined ones not among
    /// them), with the size the catalog records (`None`: a quarantined segment whose size the
    /// catalog does not hold), sorted by key.
    pub objects: Vec<(String, Option<u64>)>,
    /// Every registered stream, sorted by name.
    pub streams: Vec<StreamExtent>,
}

/// One stream as a catalog copy has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamExtent {
    pub id: u64,
    pub name: String,
    /// First readable offset (trims and retention raise it).
    pub start_offset: u64,
    /// One past the last record the catalog's segments hold (a fork without records of its
    /// own: its fork point).
    pub next_offset: u64,
    pub closed: bool,
    /// Deleted for clients, kept while forks read it.
    pub soft_deleted: bool,
    /// The source of a fork.
    pub fork_source: Option<String>,
}

/// Writes a consistent copy of the SQLite catalog at `db` to `dest` (which must not exist)
/// and reads back what the copy names. Blocking: run it on a thread of its own.
pub fn copy_sqlite_catalog(db: &Path, dest: &Path) -> Result<CatalogCopy, MetaError> {
    if dest.exists() {
        return Err(MetaError::Storage(format!(
            "{} exists already; a catalog copy goes to a new file",
            dest.display()
        )));
    }
    let Some(dest_text) = dest.to_str() else {
        return Err(MetaError::Storage(format!(
            "{} is not valid UTF-8; SQLite takes the path as text",
            dest.display()
        )));
    };
    // Read-write without create: a reader of a WAL database maps its -shm file, and a
    // missing database is an error here, not a new empty one.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    // The copy is written with the catalog's page checksums, and the catalog checked as read.
    crate::page_checksums::register()?;
    let conn = Connection::open_with_flags(db, flags)
        .map_err(|e| MetaError::Storage(format!("open {}: {e}", db.display())))?;
    conn.busy_timeout(std::time::Duration::from_secs(SQLITE_BUSY_TIMEOUT_SECS))
        .map_err(storage("set busy_timeout"))?;
    conn.execute("VACUUM INTO ?1", [dest_text])
        .map_err(storage("copy the catalog (VACUUM INTO)"))?;
    drop(conn);
    // The copy is a complete database of its own; make it durable before anything names it.
    std::fs::File::open(dest)
        .and_then(|file| file.sync_all())
        .map_err(|e| MetaError::Storage(format!("sync {}: {e}", dest.display())))?;
    read_catalog_copy(dest)
}

/// What the catalog copy at `path` names; opened read-only, never changed.
pub fn read_catalog_copy(path: &Path) -> Result<CatalogCopy, MetaError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    crate::page_checksums::register()?;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| MetaError::Storage(format!("open {}: {e}", path.display())))?;
    let schema_version: i64 = conn
        .query_row("SELECT max(version) FROM schema_version", [], |row| {
            row.get::<_, Option<i64>>(0)
        })
        .map_err(storage("read the schema version"))?
        .unwrap_or(0);
    let mut objects: BTreeMap<String, Option<u64>> = BTreeMap::new();
    {
        let mut statement = conn
            .prepare("SELECT key, size_bytes FROM segments")
            .map_err(storage("list segments"))?;
        let rows = statement
            .query_map([], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, u64>(1)?))
            })
            .map_err(storage("list segments"))?;
        for row in rows {
            let (key, size) = row.map_err(storage("read a segment row"))?;
            objects.insert(key, Some(size));
        }
    }
    if has_table(&conn, "quarantine")? {
        let mut statement = conn
            .prepare("SELECT DISTINCT segment_key FROM quarantine")
            .map_err(storage("list quarantined segments"))?;
        let rows = statement
            .query_map([], |row| row.get::<_, String>(0))
            .map_err(storage("list quarantined segments"))?;
        for row in rows {
            objects
                .entry(row.map_err(storage("read a quarantine row"))?)
                .or_insert(None);
        }
    }
    let mut tails: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    {
        let mut statement = conn
            .prepare("SELECT stream_id, runs, closed FROM segment_streams")
            .map_err(storage("list segment entries"))?;
        let rows = statement
            .query_map([], |row| {
                Ok((
                    row.get::<_, u64>(0)?,
                    row.get::<_, Vec<u8>>(1)?,
                    row.get::<_, bool>(2)?,
                ))
            })
            .map_err(storage("list segment entries"))?;
        for row in rows {
            let (id, runs, closed) = row.map_err(storage("read a segment entry"))?;
            let runs = crate::runs::decode(&runs).ok_or_else(|| {
                MetaError::Storage(format!("a segment entry of stream {id}: bad runs"))
            })?;
            let next = runs.iter().map(|r| r.next_offset).max().unwrap_or(0);
            let tail = tails.entry(id).or_insert((0, false));
            tail.0 = tail.0.max(next);
            tail.1 |= closed;
        }
    }
    let mut streams = Vec::new();
    {
        let mut statement = conn
            .prepare(
                "SELECT id, name, start_offset, closed, soft_deleted, fork_source, fork_offset \
                 FROM streams ORDER BY name",
            )
            .map_err(storage("list streams"))?;
        let rows = statement
            .query_map([], |row| {
                Ok((
                    row.get::<_, u64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, u64>(2)?,
                    row.get::<_, bool>(3)?,
                    row.get::<_, bool>(4)?,
                    row.get::<_, Option<String>>(5)?,
                    row.get::<_, Option<u64>>(6)?,
                ))
            })
            .map_err(storage("list streams"))?;
        for row in rows {
            let (id, name, start_offset, closed, soft_deleted, fork_source, fork_offset) =
                row.map_err(storage("read a stream row"))?;
            let (own_next, own_closed) = tails.get(&id).copied().unwrap_or((0, false));
            streams.push(StreamExtent {
                id,
                name,
                start_offset,
                next_offset: own_next.max(fork_offset.unwrap_or(0)).max(start_offset),
                closed: closed || own_closed,
                soft_deleted,
                fork_source,
            });
        }
    }
    Ok(CatalogCopy {
        schema_version,
        objects: objects.into_iter().collect(),
        streams,
    })
}

fn has_table(conn: &Connection, name: &str) -> Result<bool, MetaError> {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |row| row.get::<_, i64>(0),
    )
    .map(|count| count > 0)
    .map_err(storage("look for a table"))
}

#[cfg(test)]
mod tests {
    use futures_lite::future::block_on;

    use super::*;
    use crate::{MetaStore, MetaUrl, Retention, SegmentRecord, SegmentRun, SegmentStreamEntry};

    fn config() -> crate::StreamConfig {
        crate::StreamConfig {
            content_type: "text/plain".into(),
            ttl_sec: None,
            expires_at_ms: None,
            retention: Retention::default(),
        }
    }

    #[test]
    fn a_copy_names_the_committed_segments_and_each_streams_extent() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        let (store, _) = MetaStore::open(&MetaUrl::SqliteFile(db.clone())).unwrap();
        let a = block_on(store.create_stream("/a", config(), 1))
            .unwrap()
            .unwrap();
        let b = block_on(store.create_stream("/b", config(), 1))
            .unwrap()
            .unwrap();
        let entry = |id: u64, first: u64, next: u64, closed: bool| SegmentStreamEntry {
            stream_id: id,
            runs: vec![SegmentRun {
                first_offset: first,
                next_offset: next,
                byte_start: 0,
                byte_end: 10,
            }],
            last_timestamp_ms: 1,
            closed,
            producers: Vec::new(),
            closed_by: None,
            writer_seq: None,
        };
        let segment = |key: &str, streams| SegmentRecord {
            key: key.into(),
            size_bytes: 10,
            created_ms: 1,
            streams,
        };
        block_on(store.commit_segment(segment(
            "segments/1.seg",
            vec![entry(a.row.id, 0, 5, false)],
        )))
        .unwrap()
        .unwrap();
        block_on(store.commit_segment(segment(
            "segments/2.seg",
            vec![entry(a.row.id, 5, 7, false), entry(b.row.id, 0, 3, true)],
        )))
        .unwrap()
        .unwrap();
        block_on(store.trim_stream(a.row.id, 2)).unwrap().unwrap();
        let dest = dir.path().join("copy.db");
        let copy = copy_sqlite_catalog(&db, &dest).unwrap();
        assert_eq!(
            copy.objects,
            vec![
                ("segments/1.seg".to_string(), Some(10)),
                ("segments/2.seg".to_string(), Some(10))
            ]
        );
        assert_eq!(copy.streams.len(), 2);
        assert_eq!(
            (copy.streams[0].start_offset, copy.streams[0].next_offset),
            (2, 7)
        );
        assert!(!copy.streams[0].closed);
        assert_eq!(copy.streams[1].next_offset, 3);
        assert!(copy.streams[1].closed);
        assert_eq!(copy.schema_version, crate::schema::SCHEMA_VERSION);
        // A commit after the copy is not in it; a second copy to the same file is refused.
        block_on(store.commit_segment(segment(
            "segments/3.seg",
            vec![entry(b.row.id, 3, 4, false)],
        )))
        .unwrap()
        .unwrap();
        assert_eq!(read_catalog_copy(&dest).unwrap().objects.len(), 2);
        assert!(copy_sqlite_catalog(&db, &dest).is_err());
        store.shutdown();
    }
}
