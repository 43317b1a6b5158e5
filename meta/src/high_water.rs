//! The SQLite catalog's high-water mark: how far its ids have ever reached, kept in a file of
//! its own beside the database, so a catalog that went back is refused at start instead of
//! served.
//!
//! A catalog goes back when its newest commits are lost while older ones stay: its `-wal`
//! file deleted or cut, an older copy of `meta.db` put back. Served as it is, it would bring
//! back deleted streams, reopen closed ones, forget acknowledged records (and hand their
//! offsets out again), and the start-up sweep would delete the segment objects of the lost
//! commits as never committed. SQLite cannot tell: each file is valid on its own.
//!
//! ```text
//! <dir>/.<db file name>.high-water     one line of fixed width, rewritten in place after a
//!                                      commit that raised either number:
//! streams <n:020> segments <m:020>\n   n, m: `sqlite_sequence` of `streams` and `segments`
//!                                      (AUTOINCREMENT: they only grow, deletes included),
//!                                      20 digits with leading zeros
//! ```
//!
//! The mark is written after the commit, without an fsync: a crash can leave it behind the
//! catalog (a weaker check, never a false one), never ahead. Its 48 bytes are one write
//! within one sector; a mark that does not parse checks nothing. Its name starts with a dot so a
//! `rm meta.db*` of the database's files leaves it. A missing or unreadable mark checks
//! nothing (a catalog from before marks, a new one).

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::schema::storage;
use crate::MetaError;

/// How far a catalog's ids reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Mark {
    pub streams: i64,
    pub segments: i64,
}

impl Mark {
    /// The catalog's own numbers now.
    pub(crate) fn of(conn: &Connection) -> Result<Mark, MetaError> {
        let mut mark = Mark::default();
        let mut query = conn
            .prepare_cached("SELECT name, seq FROM sqlite_sequence")
            .map_err(storage("read sqlite_sequence"))?;
        let rows = query
            .query_map([], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })
            .map_err(storage("read sqlite_sequence"))?;
        for row in rows {
            match row.map_err(storage("read sqlite_sequence"))? {
                (name, seq) if name == "streams" => mark.streams = seq,
                (name, seq) if name == "segments" => mark.segments = seq,
                _ => {}
            }
        }
        Ok(mark)
    }

    fn reaches(&self, other: &Mark) -> bool {
        self.streams >= other.streams && self.segments >= other.segments
    }
}

/// Where the mark of the database at `db` lives.
pub(crate) fn path_of(db: &Path) -> PathBuf {
    let name = db
        .file_name()
        .map_or_else(|| "meta.db".into(), |n| n.to_string_lossy().into_owned());
    db.with_file_name(format!(".{name}.high-water"))
}

fn read(path: &Path) -> Option<Mark> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut words = text.split_whitespace();
    let mut number = |label: &str| -> Option<i64> {
        (words.next()? == label).then_some(())?;
        words.next()?.parse().ok()
    };
    Some(Mark {
        streams: number("streams")?,
        segments: number("segments")?,
    })
}

/// `Err` when the catalog at `db` is behind its mark: it went back.
pub(crate) fn check(db: &Path, conn: &Connection) -> Result<Mark, MetaError> {
    let now = Mark::of(conn)?;
    let path = path_of(db);
    match read(&path) {
        Some(reached) if !now.reaches(&reached) => Err(MetaError::Storage(format!(
            "the catalog {} went back: its ids reach streams {} and segments {}, but they had \
             reached streams {} and segments {} ({}). Its newest commits are lost (its -wal file \
             deleted or cut, or an older copy put back); served as it is, it would bring back \
             deleted streams, forget acknowledged records and hand their offsets out again, and \
             delete the segment objects of the lost commits as never committed. Put the lost \
             file back. To serve this catalog anyway, copy the bucket first, then remove {}",
            db.display(),
            now.streams,
            now.segments,
            reached.streams,
            reached.segments,
            path.display(),
            path.display()
        ))),
        _ => Ok(now),
    }
}

/// The open mark of one database, rewritten in place. Its file is also the catalog's lock:
/// held (`flock`) for as long as this lives, so one process at a time serves a SQLite catalog.
pub(crate) struct MarkFile {
    path: PathBuf,
    file: std::fs::File,
    written: Mark,
}

impl MarkFile {
    /// Opens (creating it) the mark of the database at `db` and locks it, before the database
    /// is opened: two nodes on one SQLite catalog (each with its own WAL directory) would each
    /// hand out a stream's next offsets to records of their own, and one's would be lost.
    /// Refused while another process holds it; the kernel lets go when this process ends,
    /// `kill -9` included.
    pub(crate) fn lock(db: &Path) -> Result<MarkFile, MetaError> {
        let path = path_of(db);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| {
                MetaError::Storage(format!(
                    "cannot open the catalog's lock {}: {e}",
                    path.display()
                ))
            })?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        match (locked != 0).then(std::io::Error::last_os_error) {
            None => {}
            Some(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                return Err(MetaError::Storage(format!(
                    "the catalog {} is in use by another process (it holds {}): two nodes on \
                     one SQLite catalog would hand out the same offsets to different records. \
                     Stop the other node, or give this one a catalog of its own (--meta-url); \
                     nodes share a catalog only through Postgres, as a cluster",
                    db.display(),
                    path.display()
                )))
            }
            Some(e) => {
                return Err(MetaError::Storage(format!(
                    "cannot lock the catalog's lock {}: {e}",
                    path.display()
                )))
            }
        }
        Ok(MarkFile {
            path,
            file,
            written: Mark::default(),
        })
    }

    /// Rewrites the mark when `now` differs from what it holds: one write in place of fixed
    /// width (a commit of creates pays a `pwrite`, not a file made and renamed). Best effort:
    /// a mark that could not be written only weakens the next start's check, and is logged.
    pub(crate) fn raise(&mut self, now: Mark) {
        use std::os::unix::fs::FileExt;
        if now == self.written {
            return;
        }
        let file = &self.file;
        let text = format!(
            "streams {:020} segments {:020}\n",
            now.streams, now.segments
        );
        match file.write_all_at(text.as_bytes(), 0) {
            Ok(()) => self.written = now,
            Err(e) => log::warn!(
                "cannot write the catalog's high-water mark {}: {e}",
                self.path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_read_back_and_a_catalog_behind_it_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE streams (id INTEGER PRIMARY KEY AUTOINCREMENT, x TEXT);
             CREATE TABLE segments (seq INTEGER PRIMARY KEY AUTOINCREMENT, x TEXT);
             INSERT INTO streams (x) VALUES ('a'), ('b');
             INSERT INTO segments (x) VALUES ('s');",
        )
        .unwrap();
        assert_eq!(path_of(&db), dir.path().join(".meta.db.high-water"));
        // No mark yet: nothing to check.
        let now = check(&db, &conn).unwrap();
        assert_eq!(
            now,
            Mark {
                streams: 2,
                segments: 1
            }
        );
        let mut file = MarkFile::lock(&db).unwrap();
        file.raise(now);
        assert_eq!(read(&path_of(&db)), Some(now));
        // Deletes do not lower the numbers: still fine.
        conn.execute_batch("DELETE FROM streams; DELETE FROM segments;")
            .unwrap();
        check(&db, &conn).unwrap();
        // A mark ahead of the catalog: it went back.
        file.raise(Mark {
            streams: 2,
            segments: 5,
        });
        let err = check(&db, &conn).unwrap_err().to_string();
        assert!(
            err.contains("went back") && err.contains("segments 5"),
            "{err}"
        );
        // An unreadable mark checks nothing.
        std::fs::write(path_of(&db), "garbage").unwrap();
        check(&db, &conn).unwrap();
    }

    #[test]
    fn one_process_at_a_time_holds_a_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        let held = MarkFile::lock(&db).unwrap();
        // Another open of the lock is refused while it is held (flock is per open file, so
        // this stands for a second process), and says what to do.
        let refused = MarkFile::lock(&db).err().expect("refused while held");
        assert!(
            refused.to_string().contains("in use by another process"),
            "{refused}"
        );
        drop(held);
        MarkFile::lock(&db).unwrap();
    }
}
