//! The catalog's witness of its WAL directory (a single node on a SQLite file): which WAL
//! directory the catalog last ran with, and whether that directory may hold acknowledged
//! records not yet stored, so a start on a different one (a WAL volume that did not mount, a
//! changed `--wal-dir`, a directory wiped while the catalog stayed) is refused instead of
//! serving every stream from its stored tail and handing the lost offsets out again. The WAL
//! ledgers (`wal_ledger.rs`) cannot see this: they go with the directory.
//!
//! ```text
//! <wal dir>/wal-id                       the directory's id, made once: <id:032x>\n
//! <catalog dir>/.<db file name>.wal      rewritten in place, fsynced, one sector:
//!   wal <id:032x> unstored <0|1>\n        the last WAL directory's id; 1 while it may hold
//!                                        acknowledged records not yet stored
//! ```
//!
//! `unstored 1` is written once recovery is done and before any append is taken (with
//! `--durability local`, or while recovered WAL files wait for the bucket); `unstored 0` after
//! a clean stop stored everything. A missing or unreadable witness or id checks nothing (a
//! catalog or WAL directory of an earlier release, a restored backup).

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use pico_meta::MetaUrl;

/// The WAL directory's id file.
const WAL_ID_FILE: &str = "wal-id";
/// The id a witness names when the WAL directory has none (it held nothing unstored).
const NO_WAL_ID: &str = "00000000000000000000000000000000";
/// Bytes of a witness line: `wal `, 32 hex digits, ` unstored `, one digit, a newline.
const WITNESS_BYTES: usize = 4 + 32 + 10 + 1 + 1;

/// What the catalog's witness says.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Witnessed {
    wal_id: String,
    unstored: bool,
}

fn parse(text: &str) -> Option<Witnessed> {
    let mut words = text.split_whitespace();
    (words.next()? == "wal").then_some(())?;
    let wal_id = words.next()?;
    (wal_id.len() == 32 && wal_id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())?;
    (words.next()? == "unstored").then_some(())?;
    let unstored = match words.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    Some(Witnessed {
        wal_id: wal_id.to_string(),
        unstored,
    })
}

fn line(wal_id: &str, unstored: bool) -> String {
    format!("wal {wal_id} unstored {}\n", u8::from(unstored))
}

/// The witness file of the SQLite catalog at `db`.
fn witness_path(db: &Path) -> PathBuf {
    let name = db
        .file_name()
        .map_or_else(|| "meta.db".into(), |n| n.to_string_lossy().into_owned());
    db.with_file_name(format!(".{name}.wal"))
}

fn read_wal_id(wal_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(wal_dir.join(WAL_ID_FILE)).ok()?;
    let id = text.trim();
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The directory `path` is in (`.` for a bare file name, as `sqlite:meta.db` gives).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Writes `bytes` to `path` whole and durably: a temporary file, synced, renamed over it,
/// its directory synced.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension("new");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    sync_dir(dir_of(path))
}

/// A fresh directory id: 128 random bits.
fn new_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Why a start was refused: the catalog's last WAL directory may hold acknowledged records,
/// and this is not it.
#[derive(Debug)]
pub struct ForeignWalDir {
    pub wal_dir: PathBuf,
    pub witness: PathBuf,
    pub expected: String,
    pub found: Option<String>,
}

impl std::fmt::Display for ForeignWalDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let found = match &self.found {
            Some(id) => format!("has id {id}"),
            None => "has no id (new, emptied or not mounted)".to_string(),
        };
        write!(
            f,
            "the catalog last ran with WAL directory {} ({}), which may hold acknowledged \
             records not yet stored, and {} {found}. Started on it, the node would serve every \
             stream from its stored records and hand the lost offsets out again. Is the volume \
             of {} mounted? Did --wal-dir change? Start with the WAL directory the node ran \
             with; or, to go on without it, start with --wal-salvage (PICO_WAL_SALVAGE=1), \
             which reports the loss (docs/durability.md, \"Missing WAL files\"). Nothing was \
             changed",
            self.expected,
            self.witness.display(),
            self.wal_dir.display(),
            self.wal_dir.display(),
        )
    }
}

impl std::error::Error for ForeignWalDir {}

/// The catalog's witness, open for this run: [`WalWitness::open`] once recovery is done,
/// [`WalWitness::clean`] after a clean stop.
pub struct WalWitness {
    path: PathBuf,
    wal_dir: PathBuf,
}

impl WalWitness {
    /// Checks the catalog's witness against `wal_dir` (a SQLite file catalog only; `None`
    /// otherwise). A WAL directory other than the witnessed one, while that one may hold
    /// unstored records, is refused, unless `salvage`: then the loss is returned as a line to
    /// report.
    pub(crate) fn check(
        url: &MetaUrl,
        wal_dir: &Path,
        salvage: bool,
    ) -> Result<(Option<WalWitness>, Option<String>), ForeignWalDir> {
        let MetaUrl::SqliteFile(db) = url else {
            return Ok((None, None));
        };
        let path = witness_path(db);
        let witness = WalWitness {
            path: path.clone(),
            wal_dir: wal_dir.to_path_buf(),
        };
        let witnessed = std::fs::read_to_string(&path).ok().and_then(|t| parse(&t));
        let found = read_wal_id(wal_dir);
        match witnessed {
            Some(w) if w.unstored && Some(&w.wal_id) != found.as_ref() => {
                let refused = ForeignWalDir {
                    wal_dir: wal_dir.to_path_buf(),
                    witness: path,
                    expected: w.wal_id,
                    found,
                };
                if !salvage {
                    return Err(refused);
                }
                Ok((
                    Some(witness),
                    Some(format!("salvaged past a lost WAL directory: {refused}")),
                ))
            }
            _ => Ok((Some(witness), None)),
        }
    }

    /// Writes whether the WAL directory may now hold unstored records, durably, before the
    /// node takes any append; with its id, made if it has none, when it may (a directory that
    /// holds nothing the catalog lacks needs none).
    pub(crate) fn open(&self, unstored: bool) -> std::io::Result<()> {
        let id = match (read_wal_id(&self.wal_dir), unstored) {
            (Some(id), _) => id,
            (None, false) => NO_WAL_ID.to_string(),
            (None, true) => {
                let id = new_id()?;
                write_new(
                    &self.wal_dir.join(WAL_ID_FILE),
                    format!("{id}\n").as_bytes(),
                )?;
                id
            }
        };
        self.write(&id, unstored)
    }

    /// After a clean stop that stored everything: the WAL directory holds nothing the
    /// catalog lacks, so a start on another one loses nothing.
    pub fn clean(&self) -> std::io::Result<()> {
        let id = read_wal_id(&self.wal_dir).unwrap_or_else(|| NO_WAL_ID.to_string());
        self.write(&id, false)
    }

    fn write(&self, wal_id: &str, unstored: bool) -> std::io::Result<()> {
        let text = line(wal_id, unstored);
        debug_assert_eq!(text.len(), WITNESS_BYTES);
        match std::fs::OpenOptions::new().write(true).open(&self.path) {
            // In place: one write within one sector, then its fsync.
            Ok(mut file) => {
                file.rewind()?;
                file.write_all(text.as_bytes())?;
                file.set_len(WITNESS_BYTES as u64)?;
                file.sync_all()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                write_new(&self.path, text.as_bytes())
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite(dir: &Path) -> MetaUrl {
        MetaUrl::SqliteFile(dir.join("meta.db"))
    }

    #[test]
    fn a_line_reads_back() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(line(id, true).len(), WITNESS_BYTES);
        assert_eq!(
            parse(&line(id, true)),
            Some(Witnessed {
                wal_id: id.into(),
                unstored: true
            })
        );
        assert_eq!(parse("wal 12 unstored 1"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn another_wal_directory_is_refused_only_while_the_last_may_hold_records() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, other) = (dir.path().join("wal"), dir.path().join("other"));
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let url = sqlite(dir.path());
        // A catalog without a witness checks nothing.
        let (witness, lost) = WalWitness::check(&url, &wal, false).unwrap();
        assert!(lost.is_none());
        witness.unwrap().open(true).unwrap();
        // The same directory: fine; another (or the same one emptied): refused.
        assert!(WalWitness::check(&url, &wal, false).is_ok());
        let refused = WalWitness::check(&url, &other, false).err().unwrap();
        assert!(refused.found.is_none(), "{refused}");
        std::fs::remove_file(wal.join(WAL_ID_FILE)).unwrap();
        assert!(WalWitness::check(&url, &wal, false).is_err());
        // With --wal-salvage: started, with the loss to report.
        let (witness, lost) = WalWitness::check(&url, &other, true).unwrap();
        assert!(lost.unwrap().contains("salvaged past a lost WAL directory"));
        let witness = witness.unwrap();
        witness.open(true).unwrap();
        assert!(WalWitness::check(&url, &other, false).is_ok());
        // After a clean stop, any directory.
        witness.clean().unwrap();
        assert!(WalWitness::check(&url, &wal, false).is_ok());
        // Other catalogs are not witnessed.
        let (none, _) = WalWitness::check(&MetaUrl::SqliteMemory, &other, false).unwrap();
        assert!(none.is_none());
    }
}
