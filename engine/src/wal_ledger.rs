//! The WAL ledger: which WAL files each core made and has not yet retired, so that recovery
//! finds a file that is gone.
//!
//! A core removes each WAL file once its segment is stored and committed (or held nothing), so
//! a missing file is normal, and without a record of which files must still be there, a file
//! deleted whole (by hand, by a cleaner, with part of a disk) left no trace: its acknowledged
//! records were lost and their offsets handed out again. The WAL gap check only finds such a
//! file when a later one holds the same streams' next records.
//!
//! Each core of each run keeps one ledger beside its WAL files, naming them by counter:
//!
//! ```text
//! <wal dir>/<epoch:016>-<core:03>.ledger       the WAL files <epoch>-<core>-<counter:010>.wal
//!                                              listed here must exist
//! two slots of LEDGER_SLOT_BYTES, rewritten in turn; the valid one with the higher seq counts:
//!   0   8   magic  "PICOLEDG"
//!   8   8   seq    u64 LE, one more at every write
//!  16   4   count  u32 LE, ranges that follow (at most LEDGER_RANGES_MAX)
//!  20  16n  ranges (first u64 LE, last u64 LE), inclusive, ascending, disjoint
//!  20+16n 4 crc32c of bytes 0..20+16n
//! ```
//!
//! The rules that make a missing listed file proof of a loss, never a false alarm:
//! - a file is added once it and its directory entry are durable, and the ledger listing it is
//!   durable before the file is handed out for appends (so every acknowledged record is in a
//!   listed file);
//! - a file is taken out, durably, before it is removed;
//! - a slot torn by a crash fails its checksum, and the other slot, one write older, counts:
//!   it lacks at most a file that was not yet handed out, or lists one not yet removed;
//! - more ranges than a slot holds: the newest are written, which checks less, never wrongly;
//! - recovery forgets a ledger (deletes it) before it removes or moves any of its files.
//!
//! A missing or unreadable ledger checks nothing (a WAL directory of an older build). A ledger
//! deleted together with the files it lists goes unnoticed, as does a whole WAL directory lost.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::DmaFile;

/// Bytes of one slot: a whole block of any device with logical blocks up to 4 KiB, so a DMA
/// write of a slot never touches the other.
pub(crate) const LEDGER_SLOT_BYTES: usize = 4096;
/// `magic`: the start of every valid slot.
const LEDGER_MAGIC: &[u8; 8] = b"PICOLEDG";
/// Bytes before the ranges: magic, seq, count.
const LEDGER_HEAD_BYTES: usize = 20;
/// Bytes of one range.
const LEDGER_RANGE_BYTES: usize = 16;
/// The most ranges a slot holds, with its checksum.
pub(crate) const LEDGER_RANGES_MAX: usize =
    (LEDGER_SLOT_BYTES - LEDGER_HEAD_BYTES - 4) / LEDGER_RANGE_BYTES;
/// The most WAL files a ledger that reads may list: far more than a core keeps (its unstored
/// bytes are bounded), and few enough to check one by one.
const LEDGER_LISTED_MAX: u64 = 1 << 20;
/// The ledger's file name extension.
const LEDGER_EXTENSION: &str = "ledger";

/// The ledger of the WAL files named `<group>-<counter>.wal`, where `group` is
/// `<epoch>-<core>`.
pub(crate) fn ledger_path(wal_dir: &Path, group: &str) -> PathBuf {
    wal_dir.join(format!("{group}.{LEDGER_EXTENSION}"))
}

/// The group (`<epoch>-<core>`) and counter of a WAL file's path.
pub(crate) fn group_and_counter(wal_file: &Path) -> Option<(&str, u64)> {
    let stem = wal_file.file_stem()?.to_str()?;
    let (group, counter) = stem.rsplit_once('-')?;
    Some((group, counter.parse().ok()?))
}

/// The counters as inclusive ranges, ascending; at most [`LEDGER_RANGES_MAX`], the newest.
fn ranges_of(live: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for &counter in live {
        match ranges.last_mut() {
            Some((_, last)) if *last + 1 == counter => *last = counter,
            _ => ranges.push((counter, counter)),
        }
    }
    let excess = ranges.len().saturating_sub(LEDGER_RANGES_MAX);
    ranges.drain(..excess);
    ranges
}

/// One slot listing `live`, written as the `seq`th.
pub(crate) fn encode_slot(live: &BTreeSet<u64>, seq: u64, slot: &mut [u8]) {
    slot.fill(0);
    let ranges = ranges_of(live);
    slot[..8].copy_from_slice(LEDGER_MAGIC);
    slot[8..16].copy_from_slice(&seq.to_le_bytes());
    slot[16..20].copy_from_slice(&(ranges.len() as u32).to_le_bytes());
    let mut at = LEDGER_HEAD_BYTES;
    for (first, last) in ranges {
        slot[at..at + 8].copy_from_slice(&first.to_le_bytes());
        slot[at + 8..at + 16].copy_from_slice(&last.to_le_bytes());
        at += LEDGER_RANGE_BYTES;
    }
    let crc = crc32c::crc32c(&slot[..at]);
    slot[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A slot's seq and counters, when it is whole.
fn decode_slot(slot: &[u8]) -> Option<(u64, BTreeSet<u64>)> {
    if slot.len() < LEDGER_HEAD_BYTES || &slot[..8] != LEDGER_MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(slot[8..16].try_into().ok()?);
    let count = u32::from_le_bytes(slot[16..20].try_into().ok()?) as usize;
    if count > LEDGER_RANGES_MAX {
        return None;
    }
    let end = LEDGER_HEAD_BYTES + count * LEDGER_RANGE_BYTES;
    let crc = u32::from_le_bytes(slot.get(end..end + 4)?.try_into().ok()?);
    if crc32c::crc32c(&slot[..end]) != crc {
        return None;
    }
    let mut live = BTreeSet::new();
    for range in slot[LEDGER_HEAD_BYTES..end].chunks_exact(LEDGER_RANGE_BYTES) {
        let first = u64::from_le_bytes(range[..8].try_into().ok()?);
        let last = u64::from_le_bytes(range[8..].try_into().ok()?);
        if last < first || last - first >= LEDGER_LISTED_MAX - live.len() as u64 {
            return None;
        }
        live.extend(first..=last);
    }
    Some((seq, live))
}

/// What a ledger's bytes list: the counters of its newer whole slot, `None` when neither is.
pub(crate) fn decode(bytes: &[u8]) -> Option<BTreeSet<u64>> {
    bytes
        .chunks(LEDGER_SLOT_BYTES)
        .take(2)
        .filter_map(decode_slot)
        .max_by_key(|(seq, _)| *seq)
        .map(|(_, live)| live)
}

/// A ledger found in a WAL directory.
pub(crate) struct FoundLedger {
    pub(crate) path: PathBuf,
    /// What it lists; `None` when neither slot reads (it checks nothing).
    pub(crate) listed: Option<BTreeSet<u64>>,
}

/// Every ledger in `wal_dir`, by group.
pub(crate) fn ledgers(wal_dir: &Path) -> std::io::Result<BTreeMap<String, FoundLedger>> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(wal_dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != LEDGER_EXTENSION) {
            continue;
        }
        let Some(group) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        let listed = std::fs::read(&path).ok().and_then(|bytes| decode(&bytes));
        found.insert(group, FoundLedger { path, listed });
    }
    Ok(found)
}

/// Deletes the ledger of `group`: recovery does before it removes or moves one of its files
/// (a ledger left listing a removed file would stop the next start). Gone already is fine.
pub(crate) fn forget(wal_dir: &Path, group: &str) -> std::io::Result<()> {
    match std::fs::remove_file(ledger_path(wal_dir, group)) {
        // Durably gone before any of its files goes: a crash must not keep the ledger and
        // lose a file it lists.
        Ok(()) => std::fs::File::open(wal_dir)?.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// [`forget`]s the ledger that lists `wal_file`, if its name has one.
pub(crate) fn unlist(wal_file: &Path) -> std::io::Result<()> {
    match (wal_file.parent(), group_and_counter(wal_file)) {
        (Some(dir), Some((group, _))) => forget(dir, group),
        _ => Ok(()),
    }
}

/// A WAL file a ledger lists that is not in the WAL directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MissingFile {
    pub(crate) path: PathBuf,
    pub(crate) ledger: PathBuf,
}

/// The WAL files the ledgers in `wal_dir` list that are not among `present`.
pub(crate) fn missing_files(
    wal_dir: &Path,
    ledgers: &BTreeMap<String, FoundLedger>,
    present: &[PathBuf],
) -> Vec<MissingFile> {
    let present: std::collections::HashSet<&Path> = present.iter().map(PathBuf::as_path).collect();
    let mut missing = Vec::new();
    for (group, ledger) in ledgers {
        for counter in ledger.listed.iter().flatten() {
            let path = wal_dir.join(format!("{group}-{counter:010}.wal"));
            if !present.contains(path.as_path()) {
                missing.push(MissingFile {
                    path,
                    ledger: ledger.path.clone(),
                });
            }
        }
    }
    missing
}

/// A running core's ledger: its WAL files made and not yet retired, written through to disk.
pub(crate) struct WalLedger {
    file: DmaFile,
    path: PathBuf,
    live: RefCell<BTreeSet<u64>>,
    /// Bumped at every change of `live`.
    changes: Cell<u64>,
    /// The change the file holds, durably.
    durable: Cell<u64>,
    /// Writes so far: each goes to the slot the one before did not (`seq % 2`), so a torn
    /// write leaves the state of the write before it.
    seq: Cell<u64>,
    /// Writes of the file, one at a time (the later writer writes what both asked for).
    writing: glommio::sync::Semaphore,
}

impl WalLedger {
    /// Makes the ledger of `group`, listing nothing, durably (its directory entry is made
    /// durable with the first WAL file's).
    pub(crate) async fn create(wal_dir: &Path, group: &str) -> std::io::Result<WalLedger> {
        let path = ledger_path(wal_dir, group);
        let file = DmaFile::create(&path).await?;
        if !LEDGER_SLOT_BYTES.is_multiple_of(file.alignment() as usize) {
            return Err(std::io::Error::other(format!(
                "{}: blocks of {} bytes are larger than a ledger slot",
                path.display(),
                file.alignment()
            )));
        }
        let ledger = WalLedger {
            file,
            path,
            live: RefCell::new(BTreeSet::new()),
            changes: Cell::new(0),
            durable: Cell::new(0),
            seq: Cell::new(0),
            writing: glommio::sync::Semaphore::new(1),
        };
        // Both slots, so neither write later needs a block the filesystem may not have.
        for _ in 0..2 {
            ledger.changes.set(ledger.changes.get() + 1);
            ledger.persist().await?;
        }
        Ok(ledger)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Lists WAL file `counter`; durable when this returns `Ok`.
    pub(crate) async fn add(&self, counter: u64) -> std::io::Result<()> {
        self.live.borrow_mut().insert(counter);
        self.changes.set(self.changes.get() + 1);
        self.persist().await
    }

    /// Takes WAL file `counter` out; durable when this returns `Ok`, and only then may the
    /// file be removed.
    pub(crate) async fn retire(&self, counter: u64) -> std::io::Result<()> {
        if !self.live.borrow_mut().remove(&counter) {
            return Ok(());
        }
        self.changes.set(self.changes.get() + 1);
        self.persist().await
    }

    /// Writes `live` into the older slot with `RWF_DSYNC`, unless a write since the caller's
    /// change already holds it.
    async fn persist(&self) -> std::io::Result<()> {
        let wanted = self.changes.get();
        let _permit = self
            .writing
            .acquire_permit(1)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if self.durable.get() >= wanted {
            return Ok(());
        }
        #[cfg(feature = "fault-injection")]
        if let Some(e) = self
            .path
            .parent()
            .and_then(|dir| crate::faults::take(dir, crate::faults::WalIo::Ledger))
        {
            return Err(e);
        }
        let change = self.changes.get();
        let seq = self.seq.get() + 1;
        let mut slot = self.file.alloc_dma_buffer(LEDGER_SLOT_BYTES);
        encode_slot(&self.live.borrow(), seq, slot.as_bytes_mut());
        let at = (seq % 2) * LEDGER_SLOT_BYTES as u64;
        let written = self.file.write_rc_at_durable(Rc::new(slot), at).await?;
        if written < LEDGER_SLOT_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short ledger write: {written} of {LEDGER_SLOT_BYTES} bytes"),
            ));
        }
        self.seq.set(seq);
        self.durable.set(change);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(live: &[u64], seq: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; LEDGER_SLOT_BYTES];
        encode_slot(&live.iter().copied().collect(), seq, &mut bytes);
        bytes
    }

    #[test]
    fn the_newer_whole_slot_counts() {
        let mut file = slot(&[3, 4, 5, 9], 7);
        file.extend(slot(&[4, 5, 9, 10], 8));
        assert_eq!(decode(&file), Some([4, 5, 9, 10].into()));
        // A torn newer slot: the older one counts.
        file[LEDGER_SLOT_BYTES + 30] ^= 0x40;
        assert_eq!(decode(&file), Some([3, 4, 5, 9].into()));
        // Neither: nothing is checked.
        file[30] ^= 0x40;
        assert_eq!(decode(&file), None);
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&vec![0u8; 2 * LEDGER_SLOT_BYTES]), None);
    }

    #[test]
    fn an_empty_ledger_lists_nothing() {
        assert_eq!(decode(&slot(&[], 1)), Some(BTreeSet::new()));
    }

    #[test]
    fn too_many_ranges_keep_the_newest() {
        let live: Vec<u64> = (0..(LEDGER_RANGES_MAX as u64 + 10))
            .map(|n| n * 2)
            .collect();
        let listed = decode(&slot(&live, 1)).unwrap();
        assert_eq!(listed.len(), LEDGER_RANGES_MAX);
        assert_eq!(listed.last(), live.last());
        assert!(!listed.contains(&0));
    }

    #[test]
    fn a_wal_file_names_its_group_and_counter() {
        let path = Path::new("/w/0001796605269398-001-0000000042.wal");
        assert_eq!(group_and_counter(path), Some(("0001796605269398-001", 42)));
        assert_eq!(group_and_counter(Path::new("/w/LOCK")), None);
    }
}
