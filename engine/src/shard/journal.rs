//! The journal: one core's open segments, their WAL files and health, the commit rounds that
//! make them durable and the appends waiting for that, owned in one place. Callers append
//! frames to the active segment, take the next commit round, mark it written, release the
//! acknowledgements it allows and take the front segment to seal; the fields stay private so
//! its invariants (segment numbers increasing, `durable_len <= buf.len()`, acknowledgements
//! in write order) hold by construction and are asserted in debug builds.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::io::{DmaBuffer, DmaFile};

use crate::error::{AppendError, Resume};
use crate::health::{WalFault, WalHealth};
use crate::limits;
use crate::notify::LocalNotify;
use crate::wal_file::end_round;

use super::pending::{AckQueue, PendingAck, Release};
use super::spare::{SegmentBuffers, SPARE_IDLE_MS};
use super::stream::IndexEntry;
use super::wal::WalFill;

/// A segment whose frames are still being written to its WAL file. A writer given the
/// active one (`Journal::write_active`) appends frames to `buf` and notes them in `index` and
/// `wal_epochs`; the rest is the journal's.
pub(super) struct OpenSegment {
    pub(super) no: u64,
    key: String,
    pub(super) buf: Vec<u8>,
    /// Bytes of `buf` known to be on disk (only the journal moves it).
    durable_len: usize,
    wal: Option<Rc<DmaFile>>,
    wal_path: Option<PathBuf>,
    /// Commit rounds written to the WAL file (`wal_file.rs`: each ends with a commit record
    /// in `buf`, so the file and the segment object are the same bytes).
    wal_rounds: u64,
    /// (Cluster) the owner epochs of streams whose first frame in this segment is not yet in
    /// the WAL file: the next round writes them (`wal_file::epoch_record`).
    pub(super) wal_epochs: Vec<(u64, u64)>,
    opened: Instant,
    pub(super) index: BTreeMap<u64, IndexEntry>,
}

impl OpenSegment {
    /// Bytes it holds once `needed` more frame bytes are written and the next round ends:
    /// with a WAL file, that round's epoch records and commit record too (an append may be its
    /// stream's first in the segment: one more epoch record).
    fn wal_len_after(&self, needed: usize) -> usize {
        let markers = match self.wal {
            Some(_) => (self.wal_epochs.len() + 2) * crate::wal_file::WAL_MARKER_LEN,
            None => 0,
        };
        self.buf.len() + needed + markers
    }
}

/// A WAL file ready to take a segment: the file, its path, and the counter naming it.
pub(super) type WalFile = (Rc<DmaFile>, PathBuf, u64);

/// The WAL's files and health. With memory or object durability there are no files, and
/// only the counter is used (it names the segments).
struct WalFiles {
    /// Names the next WAL file and segment (`<epoch>-<core>-<counter>`).
    counter: u64,
    /// A WAL file created ahead of time so a rotation never waits for the filesystem.
    spare: Option<WalFile>,
    /// Whether the WAL takes appends (`crate::health`).
    health: WalHealth,
    /// When the next WAL file may be tried again after it could not be made.
    retry_at: Option<Instant>,
    /// A spare WAL file is being made beside the commit rounds.
    making_spare: bool,
}

/// What the next commit round does.
pub(super) enum Round {
    /// Every open segment is durable and only the active one is open.
    Idle,
    /// The front segment is durable and no longer active: seal it.
    Seal(u64),
    /// Make segment `no` durable through `written_len` bytes; with a WAL file, by `write`.
    Write {
        no: u64,
        written_len: usize,
        write: Option<RoundWrite>,
    },
}

/// One round's DMA write: whole blocks from `start`, of which `len` bytes are the segment's.
/// The buffer goes back to the journal once written (`Journal::round_buffer_written`).
pub(super) struct RoundWrite {
    pub(super) file: Rc<DmaFile>,
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) buffer: Rc<DmaBuffer>,
    pub(super) path: Option<PathBuf>,
}

/// What the last segment left behind held when the next one opened: its writer's pace, which
/// the next segments' buffers and WAL files are made for.
#[derive(Clone, Copy, Default)]
struct LeftBehind {
    len: usize,
    wal_rounds: u64,
}

/// Whether a segment of `len` bytes written in `wal_rounds` commit rounds was filled by size
/// in small rounds: `half_segment` bytes or more, in rounds of at most
/// `limits::WAL_FILL_ROUND_BYTES_MAX` on average.
fn filled_in_small_rounds(len: usize, wal_rounds: u64, half_segment: usize) -> bool {
    let small = (limits::WAL_FILL_ROUND_BYTES_MAX as u64).saturating_mul(wal_rounds);
    len >= half_segment && wal_rounds > 0 && len as u64 <= small
}

/// A round's buffer is allocated in steps of this many bytes, so rounds of about the same size
/// reuse one buffer.
const ROUND_BUFFER_STEP_BYTES: usize = 256 * 1024;

/// WAL writes cover whole blocks of at least this many bytes, whatever smaller block the
/// device accepts for direct I/O. Disks with 512-byte logical and 4 KiB physical sectors (most
/// virtual disks) take 512-byte writes, but ext4 serialises a direct write that does not
/// cover whole 4 KiB filesystem blocks (waiting for every other write to the file, zeroing the
/// partial blocks of unwritten extents) and the device rewrites the 4 KiB sector around it: a
/// 2 MiB round written from a 512-byte boundary took 4-6 ms there, one from a 4 KiB boundary
/// 1.4 ms. A round rewriting the whole physical sector that holds the previous round's end
/// also never leaves that sector half old and half new.
const WAL_BLOCK_BYTES_MIN: usize = 4096;

/// The block a WAL file's writes are aligned to: the device's direct I/O alignment, at least
/// [`WAL_BLOCK_BYTES_MIN`].
pub(super) fn wal_block_bytes(file: &DmaFile) -> usize {
    (file.alignment() as usize).max(WAL_BLOCK_BYTES_MIN)
}

/// Where the round after `durable_len` durable bytes starts: DMA writes whole blocks, so at
/// the block holding the end of the previous round, rewriting its bytes as they are.
fn round_start(durable_len: usize, file: &DmaFile) -> usize {
    let align = wal_block_bytes(file);
    durable_len / align * align
}

/// A round buffer of at least `bytes`, in steps of [`ROUND_BUFFER_STEP_BYTES`].
fn round_buffer_of(file: &DmaFile, bytes: usize) -> DmaBuffer {
    file.alloc_dma_buffer(bytes.div_ceil(ROUND_BUFFER_STEP_BYTES) * ROUND_BUFFER_STEP_BYTES)
}

/// The front segment taken out of the journal to be sealed.
pub(super) struct Closed {
    pub(super) key: String,
    pub(super) bytes: Bytes,
    pub(super) index: BTreeMap<u64, IndexEntry>,
    pub(super) wal: Option<Rc<DmaFile>>,
    pub(super) wal_path: Option<PathBuf>,
}

/// One core's journal. Invariants, asserted in debug builds: segment numbers increase from
/// the front of `log` to its back (the active segment); every segment's `durable_len` is at
/// most its `buf.len()` and only grows; only the front segment is sealed, once durable and no
/// longer active; acknowledgements are queued in write order, through bytes of the active
/// segment.
pub(super) struct Journal {
    /// Open segments, oldest first; the last one is active (takes new frames).
    log: RefCell<VecDeque<OpenSegment>>,
    /// Buffers of sealed segments kept for the next ones (`spare.rs`).
    buffers: SegmentBuffers,
    /// Appends waiting for their acknowledgement.
    acks: RefCell<AckQueue>,
    /// The WAL's files, spare and health.
    wal: RefCell<WalFiles>,
    /// Wakes the commit loop: frames were written, a segment rotated, or a flush waits.
    commit_wanted: LocalNotify,
    /// Object durability: a flush waits for its slot in the PUT budget (`flush.rs`).
    flush_pending: Cell<bool>,
    /// The segment before the active one, as it was left.
    left_behind: Cell<LeftBehind>,
    /// The DMA buffer of the last round, kept for the next: a fresh one of a few MiB is
    /// faulted in and zeroed by the kernel at every round, on the way to the disk. Let go
    /// once no round was written for `spare::SPARE_IDLE_MS`.
    round_buffer: RefCell<Option<DmaBuffer>>,
    /// When the last round was written.
    round_buffer_used: Cell<Instant>,
    /// What the kept round buffer already holds of the next round (`stage_next_round`).
    staged: Cell<Option<Staged>>,
}

/// The kept round buffer holds segment `no`'s bytes `start..upto` at its start: copied once the
/// previous round's write completed, so the next round copies only what came after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Staged {
    no: u64,
    start: usize,
    upto: usize,
}

impl Journal {
    /// An empty journal for segments of `segment_size`, made at `now`.
    pub(super) fn new(segment_size: usize, now: Instant) -> Journal {
        Journal {
            log: RefCell::new(VecDeque::new()),
            buffers: SegmentBuffers::new(segment_size, now),
            acks: RefCell::new(AckQueue::default()),
            wal: RefCell::new(WalFiles {
                counter: 0,
                spare: None,
                health: WalHealth::Ok,
                retry_at: None,
                making_spare: false,
            }),
            commit_wanted: LocalNotify::default(),
            flush_pending: Cell::new(false),
            left_behind: Cell::new(LeftBehind::default()),
            round_buffer: RefCell::new(None),
            round_buffer_used: Cell::new(now),
            staged: Cell::new(None),
        }
    }

    // --- Segments -------------------------------------------------------------------------

    /// Opens the next active segment, `no` (above every open one), at `key`, written to `wal`
    /// when given.
    pub(super) fn open(
        &self,
        no: u64,
        key: String,
        wal: Option<(Rc<DmaFile>, PathBuf)>,
        now: Instant,
    ) {
        let (file, path) = match wal {
            Some((file, path)) => (Some(file), Some(path)),
            None => (None, None),
        };
        let mut log = self.log.borrow_mut();
        debug_assert!(
            log.back().is_none_or(|last| last.no < no),
            "segment numbers increase along the log"
        );
        let left = log.back().map_or(LeftBehind::default(), |last| LeftBehind {
            len: last.buf.len(),
            wal_rounds: last.wal_rounds,
        });
        self.left_behind.set(left);
        // The segment left behind reached half its full size: its writer fills segments.
        let filling = left.len >= self.buffers.full_bytes() / 2;
        log.push_back(OpenSegment {
            no,
            key,
            buf: self.buffers.take(now, filling),
            durable_len: 0,
            wal: file,
            wal_path: path,
            wal_rounds: 0,
            wal_epochs: Vec::new(),
            opened: now,
            index: BTreeMap::new(),
        });
    }

    /// Whether `needed` more frame bytes overflow the active segment (or its WAL file, which
    /// holds its commit records too) past `segment_size`; an empty segment takes any frame.
    pub(super) fn active_would_overflow(&self, needed: usize, segment_size: usize) -> bool {
        let (len, file_len) = self
            .log
            .borrow()
            .back()
            .map_or((0, 0), |s| (s.buf.len(), s.wal_len_after(needed)));
        len > 0 && (len + needed).max(file_len) > segment_size
    }

    /// Runs `write` on the active segment once its buffer has room for `needed` more frame
    /// bytes and the round's end (`wal_len_after`), which the commit round then appends
    /// without growing the buffer by a copy. `write` only appends to the buffer.
    pub(super) fn write_active<R>(
        &self,
        needed: usize,
        write: impl FnOnce(&mut OpenSegment) -> R,
    ) -> R {
        let mut log = self.log.borrow_mut();
        let segment = log.back_mut().expect("an active segment always exists");
        let room = segment.wal_len_after(needed) - segment.buf.len();
        reserve_frames(&mut segment.buf, room, self.buffers.full_bytes());
        let written = write(segment);
        debug_assert!(
            segment.durable_len <= segment.buf.len(),
            "frames are only appended"
        );
        written
    }

    /// The active segment's number.
    pub(super) fn active_no(&self) -> u64 {
        self.log.borrow().back().map_or(0, |s| s.no)
    }

    /// Whether the active segment holds frames.
    pub(super) fn active_has_frames(&self) -> bool {
        self.log.borrow().back().is_some_and(|s| !s.buf.is_empty())
    }

    /// Whether the active segment, numbered `target` or below, holds frames.
    pub(super) fn active_holds_frames_through(&self, target: u64) -> bool {
        self.log
            .borrow()
            .back()
            .is_some_and(|s| s.no <= target && !s.buf.is_empty())
    }

    /// Whether no open segment numbered `target` or below holds frames.
    pub(super) fn empty_through(&self, target: u64) -> bool {
        self.log
            .borrow()
            .iter()
            .all(|s| s.no > target || s.buf.is_empty())
    }

    /// When the active segment opened, if it holds frames.
    pub(super) fn active_opened_with_frames(&self) -> Option<Instant> {
        let log = self.log.borrow();
        let active = log.back().expect("an active segment always exists");
        (!active.buf.is_empty()).then_some(active.opened)
    }

    /// The owner epoch the active segment holds stream `id`'s frames at, if any.
    pub(super) fn active_epoch(&self, id: u64) -> Option<u64> {
        self.log
            .borrow()
            .back()
            .and_then(|segment| segment.index.get(&id))
            .map(|entry| entry.epoch)
    }

    /// Whether the active segment has reached `size` bytes.
    pub(super) fn active_reached(&self, size: usize) -> bool {
        self.log
            .borrow()
            .back()
            .is_some_and(|s| s.buf.len() >= size)
    }

    /// How many segments are open (the active one and those not yet sealed).
    pub(super) fn open_count(&self) -> usize {
        self.log.borrow().len()
    }

    /// Bytes the open segments hold.
    pub(super) fn open_bytes(&self) -> usize {
        self.log.borrow().iter().map(|s| s.buf.len()).sum()
    }

    /// A copy of bytes `start..end` of open segment `no`, if it is open.
    pub(super) fn open_slice(&self, no: u64, start: usize, end: usize) -> Option<Bytes> {
        let log = self.log.borrow();
        let open = log.iter().find(|s| s.no == no)?;
        Some(Bytes::copy_from_slice(&open.buf[start..end]))
    }

    /// Nothing to commit or acknowledge: one open segment, empty, and no append waiting.
    pub(super) fn settled(&self) -> bool {
        let log = self.log.borrow();
        log.len() == 1
            && log.back().is_some_and(|s| s.buf.is_empty())
            && self.acks.borrow().is_empty()
    }

    /// Memory the open segments and the spare buffers hold at `now`; spares idle too long are
    /// let go first.
    pub(super) fn memory_bytes(&self, now: Instant) -> usize {
        self.buffers.trim_idle(now);
        let idle = now.saturating_duration_since(self.round_buffer_used.get());
        if idle >= Duration::from_millis(SPARE_IDLE_MS) {
            self.round_buffer.borrow_mut().take();
            self.staged.set(None);
        }
        let log_bytes: usize = self.log.borrow().iter().map(|s| s.buf.capacity()).sum();
        let round_bytes = self
            .round_buffer
            .borrow()
            .as_ref()
            .map_or(0, DmaBuffer::capacity);
        log_bytes + self.buffers.spare_bytes() + round_bytes
    }

    /// The most a segment's buffer grows to, unless one frame needs more: the room a WAL file
    /// is made with.
    pub(super) fn full_bytes(&self) -> usize {
        self.buffers.full_bytes()
    }

    /// Takes the front segment `no` (durable, no longer active) out to be sealed, its bytes
    /// shared with the buffer they were written in.
    pub(super) fn take_front(&self, no: u64) -> Closed {
        let segment = {
            let mut log = self.log.borrow_mut();
            debug_assert_eq!(log.front().map(|s| s.no), Some(no));
            debug_assert!(log.len() > 1, "the active segment is not sealed");
            log.pop_front().expect("sealing the front segment")
        };
        debug_assert_eq!(
            segment.durable_len,
            segment.buf.len(),
            "sealed once durable"
        );
        Closed {
            key: segment.key,
            bytes: self.buffers.seal(segment.buf),
            index: segment.index,
            wal: segment.wal,
            wal_path: segment.wal_path,
        }
    }

    // --- Commit rounds --------------------------------------------------------------------

    /// Wakes the commit loop.
    pub(super) fn wake_commit(&self) {
        self.commit_wanted.notify();
    }

    /// Waits until the commit loop is woken.
    pub(super) async fn commit_wanted(&self) {
        self.commit_wanted.wait().await;
    }

    /// The next round: the oldest open segment with unwritten bytes is written (with a WAL
    /// file, its frames then the epoch records of streams new to it and its commit record at
    /// `now_ms`, in the segment's own bytes: `wal_file.rs`), else a durable one no longer
    /// active is sealed. A written round's end is taken from the segment: a failed round
    /// fails the WAL, and no round follows it.
    pub(super) fn next_round(&self, now_ms: i64) -> Round {
        let mut log = self.log.borrow_mut();
        let count = log.len();
        let job = log.iter().enumerate().find_map(|(i, segment)| {
            let sealed = i + 1 < count;
            if segment.durable_len < segment.buf.len() {
                Some((i, false))
            } else if sealed {
                Some((i, true))
            } else {
                None
            }
        });
        let Some((i, seal)) = job else {
            return Round::Idle;
        };
        let segment = &mut log[i];
        if seal {
            return Round::Seal(segment.no);
        }
        // `written_len`: the segment's bytes this round makes durable (appends that arrive
        // during the write wait for the next round).
        let Some(file) = &segment.wal else {
            return Round::Write {
                no: segment.no,
                written_len: segment.buf.len(),
                write: None,
            };
        };
        let epochs = std::mem::take(&mut segment.wal_epochs);
        segment.wal_rounds += 1;
        end_round(&mut segment.buf, segment.wal_rounds, &epochs, now_ms);
        let written_len = segment.buf.len();
        let align = wal_block_bytes(file);
        let start = round_start(segment.durable_len, file);
        let size = (written_len - start).div_ceil(align) * align;
        let staged = self.staged.take();
        let kept = self
            .round_buffer
            .borrow_mut()
            .take()
            .filter(|kept| kept.capacity() >= size);
        // Where the copy starts: past what was staged for this very round, if anything was.
        let from = match (&kept, staged) {
            (Some(_), Some(staged))
                if staged.no == segment.no
                    && staged.start == start
                    && staged.upto <= written_len =>
            {
                staged.upto
            }
            _ => start,
        };
        let mut buffer = kept.unwrap_or_else(|| round_buffer_of(file, size));
        buffer.set_len(size);
        let dst = buffer.as_bytes_mut();
        debug_assert!(
            dst[..from - start] == segment.buf[start..from],
            "the staged bytes are the segment's"
        );
        dst[from - start..written_len - start].copy_from_slice(&segment.buf[from..written_len]);
        dst[written_len - start..].fill(0);
        Round::Write {
            no: segment.no,
            written_len,
            write: Some(RoundWrite {
                file: file.clone(),
                start,
                len: written_len - start,
                buffer: Rc::new(buffer),
                path: segment.wal_path.clone(),
            }),
        }
    }

    /// A round made segment `no` durable through `written_len` bytes.
    pub(super) fn round_written(&self, no: u64, written_len: usize) {
        if let Some(segment) = self.log.borrow_mut().iter_mut().find(|s| s.no == no) {
            debug_assert!(
                segment.durable_len <= written_len && written_len <= segment.buf.len(),
                "a round makes durable what the segment holds, past what was"
            );
            segment.durable_len = written_len;
        }
    }

    /// A round's buffer, written at `now`, is kept for the next round (unless its write still
    /// holds it).
    pub(super) fn round_buffer_written(&self, buffer: Rc<DmaBuffer>, now: Instant) {
        self.round_buffer_used.set(now);
        self.staged.set(None);
        if let Ok(buffer) = Rc::try_unwrap(buffer) {
            *self.round_buffer.borrow_mut() = Some(buffer);
        }
    }

    /// Copies into the kept round buffer what segment `no` holds past `durable_len` (what the
    /// round just written made durable), from the block the next round
    /// starts at. Segments only grow at their end, so those bytes are the next round's as they
    /// are; `next_round` then copies only what came after. A kept buffer too small for them
    /// is replaced by one twice their size (at most the segment's full size).
    pub(super) fn stage_next_round(&self, no: u64, durable_len: usize) {
        let log = self.log.borrow();
        let Some(segment) = log.iter().find(|s| s.no == no) else {
            return;
        };
        let Some(file) = &segment.wal else {
            return;
        };
        let upto = segment.buf.len();
        if upto <= durable_len {
            return;
        }
        let start = round_start(durable_len, file);
        let len = upto - start;
        let mut kept = self.round_buffer.borrow_mut();
        if kept.as_ref().is_some_and(|buffer| buffer.capacity() < len) {
            *kept = None;
        }
        let buffer = kept.get_or_insert_with(|| {
            round_buffer_of(file, (2 * len).min(self.full_bytes().max(len)))
        });
        buffer.set_len(len);
        buffer
            .as_bytes_mut()
            .copy_from_slice(&segment.buf[start..upto]);
        self.staged.set(Some(Staged { no, start, upto }));
    }

    /// Whether no open segment has bytes waiting for a round.
    pub(super) fn all_durable(&self) -> bool {
        self.log
            .borrow()
            .iter()
            .all(|s| s.durable_len == s.buf.len())
    }

    // --- Acknowledgements -----------------------------------------------------------------

    /// Queues the acknowledgement of an append just written, through byte `ack.end` of
    /// segment `ack.segment`.
    pub(super) fn queue_ack(&self, ack: PendingAck) {
        debug_assert!(
            self.log
                .borrow()
                .back()
                .is_some_and(|s| s.no == ack.segment && ack.end <= s.buf.len()),
            "an append is acknowledged through bytes of the active segment"
        );
        self.acks.borrow_mut().push(ack);
    }

    /// Takes, in order, the acknowledgements whose bytes are durable in the WAL (or need none)
    /// and the fenced ones (`AckQueue::take_released`); `hold` holds back all but the fenced.
    pub(super) fn take_durable(&self, hold: bool) -> Vec<(PendingAck, Release)> {
        let durable: HashMap<u64, usize> = self
            .log
            .borrow()
            .iter()
            .map(|s| (s.no, s.durable_len))
            .collect();
        self.acks.borrow_mut().take_released(hold, |ack| {
            durable.get(&ack.segment).is_none_or(|&len| len >= ack.end)
        })
    }

    /// Object durability: takes, in order, the acknowledgements whose segment is `uploaded`,
    /// and the fenced ones; `hold` holds back all but the fenced.
    pub(super) fn take_uploaded(
        &self,
        hold: bool,
        uploaded: impl Fn(u64) -> bool,
    ) -> Vec<(PendingAck, Release)> {
        self.acks
            .borrow_mut()
            .take_released(hold, |ack| uploaded(ack.segment))
    }

    /// Bytes of the appends waiting for acknowledgement.
    pub(super) fn in_flight_bytes(&self) -> usize {
        self.acks.borrow().in_flight_bytes()
    }

    /// Whether any append waits for its acknowledgement.
    pub(super) fn acks_pending(&self) -> bool {
        !self.acks.borrow().is_empty()
    }

    /// The waiting appends of incarnation `(id, epoch)` fail at the next release.
    pub(super) fn fence_acks(&self, id: u64, epoch: u64) {
        self.acks.borrow_mut().fence(id, epoch);
    }

    /// Takes every waiting acknowledgement (the WAL failed: they all fail).
    pub(super) fn drain_acks(&self) -> Vec<PendingAck> {
        self.acks.borrow_mut().drain()
    }

    // --- WAL files and health -------------------------------------------------------------

    /// The counter of the next WAL file or segment; each is used once.
    pub(super) fn next_counter(&self) -> u64 {
        let mut wal = self.wal.borrow_mut();
        let counter = wal.counter;
        wal.counter += 1;
        counter
    }

    /// Gives `counter` back when it was the last taken and nothing was made under its name.
    pub(super) fn give_back_counter(&self, counter: u64) {
        let mut wal = self.wal.borrow_mut();
        if wal.counter == counter + 1 {
            wal.counter = counter;
        }
    }

    /// Whether a spare WAL file is ready.
    pub(super) fn has_spare(&self) -> bool {
        self.wal.borrow().spare.is_some()
    }

    /// Takes the spare WAL file for a new segment.
    pub(super) fn take_spare(&self) -> Option<WalFile> {
        self.wal.borrow_mut().spare.take()
    }

    /// How the next WAL file is made ready ([`WalFill`]): written through whole for a writer
    /// that fills segments in small rounds ([`Journal::filling`]); else its head, as far as
    /// twice what the last segment held when that one sealed short of half full (by age: a
    /// slow writer's next segment likely holds as much), `limits::WAL_HEAD_WRITTEN_BYTES` at
    /// least. A writer of large rounds that fills segments gets the least: the zeros would
    /// compete with its rounds for the disk.
    pub(super) fn next_fill(&self, half_segment: usize) -> WalFill {
        if self.filling(half_segment) {
            return WalFill::Written;
        }
        let left = self.left_behind.get().len;
        let expected = if left < half_segment { left * 2 } else { 0 };
        WalFill::Head(expected.max(limits::WAL_HEAD_WRITTEN_BYTES))
    }

    /// Whether a spare WAL file is being made beside the commit rounds.
    pub(super) fn making_spare(&self) -> bool {
        self.wal.borrow().making_spare
    }

    pub(super) fn set_making_spare(&self, making: bool) {
        self.wal.borrow_mut().making_spare = making;
    }

    /// Whether the writer fills segments in small commit rounds, so that the next WAL file is
    /// written through (`wal::WalFill`): the active segment or the last one left behind was
    /// ([`filled_in_small_rounds`]).
    fn filling(&self, half_segment: usize) -> bool {
        let left = self.left_behind.get();
        filled_in_small_rounds(left.len, left.wal_rounds, half_segment)
            || self.log.borrow().back().is_some_and(|active| {
                filled_in_small_rounds(active.buf.len(), active.wal_rounds, half_segment)
            })
    }

    /// A spare WAL file was made (`None`: the WAL has no files).
    pub(super) fn set_spare(&self, spare: Option<WalFile>) {
        let mut wal = self.wal.borrow_mut();
        wal.retry_at = None;
        wal.spare = spare;
    }

    /// Whether making the next WAL file may be tried at `now`.
    pub(super) fn spare_due(&self, now: Instant) -> bool {
        self.wal.borrow().retry_at.is_none_or(|at| now >= at)
    }

    /// The next WAL file could not be made: tried again at `at`.
    pub(super) fn retry_spare_at(&self, at: Instant) {
        self.wal.borrow_mut().retry_at = Some(at);
    }

    /// Whether the WAL's health is `health`.
    pub(super) fn health_is(&self, health: &WalHealth) -> bool {
        self.wal.borrow().health == *health
    }

    pub(super) fn set_health(&self, health: WalHealth) {
        self.wal.borrow_mut().health = health;
    }

    /// Why the WAL failed, if it did (appends stop until a restart).
    pub(super) fn failure(&self) -> Option<WalFault> {
        match &self.wal.borrow().health {
            WalHealth::Failed { fault } => Some(fault.clone()),
            _ => None,
        }
    }

    /// Whether the WAL failed: it takes appends again only after a restart.
    pub(super) fn failed(&self) -> bool {
        matches!(self.wal.borrow().health, WalHealth::Failed { .. })
    }

    /// Whether the next WAL file could not be made (it is tried again).
    pub(super) fn no_next_file(&self) -> bool {
        matches!(self.wal.borrow().health, WalHealth::NoNextFile { .. })
    }

    /// Whether an append of `needed` frame bytes may go to the WAL now (`crate::health`).
    pub(super) fn check_writable(&self, needed: usize) -> Result<(), AppendError> {
        match &self.wal.borrow().health {
            WalHealth::Ok => Ok(()),
            WalHealth::Failed { fault } => Err(AppendError::WritesStopped {
                fault: fault.clone(),
                until: Resume::Restart,
            }),
            WalHealth::NoNextFile { fault } => {
                // The active file was pre-allocated with this much room.
                let file_len = self
                    .log
                    .borrow()
                    .back()
                    .map_or(0, |s| s.wal_len_after(needed));
                if file_len <= self.buffers.full_bytes() {
                    return Ok(());
                }
                let out_of_space = fault.out_of_space();
                let fault = fault.clone();
                Err(if out_of_space {
                    AppendError::OutOfSpace { fault }
                } else {
                    AppendError::WritesStopped {
                        fault,
                        until: Resume::NextFile,
                    }
                })
            }
        }
    }

    // --- Object durability's flushes ------------------------------------------------------

    /// Whether a flush waits for its slot in the PUT budget.
    pub(super) fn flush_pending(&self) -> bool {
        self.flush_pending.get()
    }

    pub(super) fn set_flush_pending(&self, pending: bool) {
        self.flush_pending.set(pending);
    }
}

/// Makes room in a segment buffer for `needed` more bytes: doubling, to amortize the copies,
/// up to `full` (a full segment plus its slack). Past it (one frame larger than that, or a
/// rotation still waiting for its next WAL file while frames keep coming) by a quarter of
/// `full` at least: grown to each frame's exact end, every frame would copy the whole buffer.
pub(super) fn reserve_frames(buf: &mut Vec<u8>, needed: usize, full: usize) {
    let want = buf.len().saturating_add(needed);
    if want <= buf.capacity() {
        return;
    }
    let target = if want <= full {
        want.max(buf.capacity().saturating_mul(2).min(full))
    } else {
        want.max(buf.capacity().saturating_add(full / 4))
    };
    buf.reserve_exact(target - buf.len());
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use glommio::io::DmaFile;

    use super::{reserve_frames, Journal, Round, SPARE_IDLE_MS};

    /// Writes `bytes` frame bytes to the active segment and takes the round that writes them.
    fn round_of(journal: &Journal, bytes: usize) -> super::RoundWrite {
        journal.write_active(bytes, |segment| {
            segment.buf.resize(segment.buf.len() + bytes, 7)
        });
        match journal.next_round(0) {
            Round::Write {
                write: Some(write), ..
            } => write,
            _ => panic!("a round with a WAL write"),
        }
    }

    #[test]
    fn the_next_wal_file_s_head_covers_what_a_slow_writer_s_last_segment_held() {
        use super::WalFill;
        use crate::limits::WAL_HEAD_WRITTEN_BYTES;
        let now = Instant::now();
        let half = 512 * 1024;
        let journal = Journal::new(2 * half, now);
        // Segment `no` holds `len` bytes when segment `no + 1` opens.
        let left_behind = |len: usize, no: u64| {
            journal.write_active(len, |segment| segment.buf.resize(len, 1));
            journal.open(no + 1, format!("k{}", no + 1), None, now);
        };
        journal.open(0, "k0".into(), None, now);
        assert_eq!(
            journal.next_fill(half),
            WalFill::Head(WAL_HEAD_WRITTEN_BYTES)
        );
        // Sealed by age short of half full: twice what it held.
        left_behind(200 * 1024, 0);
        assert_eq!(journal.next_fill(half), WalFill::Head(400 * 1024));
        // Little: the head at least.
        left_behind(1000, 1);
        assert_eq!(
            journal.next_fill(half),
            WalFill::Head(WAL_HEAD_WRITTEN_BYTES)
        );
        // Filled past half in one large round: the head only.
        left_behind(600 * 1024, 2);
        assert_eq!(
            journal.next_fill(half),
            WalFill::Head(WAL_HEAD_WRITTEN_BYTES)
        );
    }

    /// Runs `test` on an executor, with a journal whose active segment has a WAL file.
    fn with_wal_journal<F, Fut>(test: F)
    where
        F: FnOnce(Journal, Rc<DmaFile>, Instant) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        glommio::LocalExecutorBuilder::default()
            .make()
            .unwrap()
            .run(async move {
                let file = Rc::new(DmaFile::create(&path).await.unwrap());
                let start = Instant::now();
                let journal = Journal::new(1 << 20, start);
                journal.open(0, "k".into(), Some((file.clone(), path)), start);
                test(journal, file, start).await;
            });
    }

    #[test]
    fn a_round_s_buffer_is_reused_by_the_next_and_let_go_when_idle() {
        with_wal_journal(|journal, file, start| async move {
            let first = round_of(&journal, 10_000);
            let at = first.buffer.as_ptr();
            assert!(first.buffer.len() >= 10_000);
            let written = file.write_rc_at(first.buffer.clone(), 0).await.unwrap();
            assert_eq!(written, first.buffer.len());
            journal.round_buffer_written(first.buffer, start);
            let counted = journal.memory_bytes(start);
            assert!(
                counted >= journal.open_bytes() + super::ROUND_BUFFER_STEP_BYTES,
                "the kept buffer is counted: {counted}"
            );

            // A buffer still held by its write is not taken by the next round.
            let second = round_of(&journal, 20_000);
            assert_eq!(second.buffer.as_ptr(), at, "the same pages, written again");
            let held = second.buffer.clone();
            journal.round_buffer_written(second.buffer, start);
            let third = round_of(&journal, 1_000);
            assert_ne!(third.buffer.as_ptr(), at, "held by a write: not reused");
            drop(held);

            // A round larger than the kept buffer gets a larger one.
            journal.round_buffer_written(third.buffer, start);
            let large = round_of(&journal, 300_000);
            assert!(large.buffer.len() >= 300_000);
            journal.round_buffer_written(large.buffer, start);

            let later = start + Duration::from_millis(SPARE_IDLE_MS);
            let kept = journal.memory_bytes(start);
            let idle = journal.memory_bytes(later);
            assert!(
                idle + super::ROUND_BUFFER_STEP_BYTES <= kept,
                "let go once idle: {kept} -> {idle}"
            );
        });
    }

    /// Every round's write covers whole 4 KiB blocks from a 4 KiB boundary, also where the
    /// device takes 512-byte direct writes (ext4 would serialise it otherwise).
    #[test]
    fn rounds_cover_whole_4_kib_blocks_whatever_the_device_alignment() {
        with_wal_journal(|journal, file, now| async move {
            assert!(super::wal_block_bytes(&file) >= 4096);
            assert_eq!(super::wal_block_bytes(&file) % file.alignment() as usize, 0);
            for (i, bytes) in [10_000usize, 1, 700, 5_000, 100_000, 3]
                .into_iter()
                .enumerate()
            {
                journal.write_active(bytes, |segment| {
                    segment.buf.resize(segment.buf.len() + bytes, i as u8)
                });
                let durable_len = journal.log.borrow()[0].durable_len;
                let Round::Write {
                    no,
                    written_len,
                    write: Some(write),
                } = journal.next_round(0)
                else {
                    panic!("a round with a WAL write");
                };
                assert_eq!(write.start % 4096, 0, "round {i} starts at {}", write.start);
                assert_eq!(
                    write.buffer.len() % 4096,
                    0,
                    "round {i}: {}",
                    write.buffer.len()
                );
                assert!(write.start <= durable_len && durable_len - write.start < 4096);
                assert!(write.start + write.buffer.len() >= written_len);
                journal.round_buffer_written(write.buffer, now);
                journal.round_written(no, written_len);
            }
        });
    }

    /// A round whose bytes were partly staged while the previous round's `fdatasync` was on
    /// its way writes exactly what a round copied whole would: the segment's bytes from the
    /// block it starts at, then zeros. Staged for another start (or a buffer too small, or a
    /// round that was written meanwhile), the round copies everything again.
    #[test]
    fn a_staged_round_writes_what_a_round_copied_whole_would() {
        with_wal_journal(|journal, _file, now| async move {
            let append = |bytes: usize, fill: u8| {
                journal.write_active(bytes, |segment| {
                    segment.buf.resize(segment.buf.len() + bytes, fill)
                })
            };
            let round = || match journal.next_round(0) {
                Round::Write {
                    no,
                    written_len,
                    write: Some(write),
                } => (no, written_len, write),
                _ => panic!("a round with a WAL write"),
            };
            // What a round must hold: the segment from `start`, zeros to the block's end.
            let expected = |write: &super::RoundWrite, written_len: usize| {
                let log = journal.log.borrow();
                let mut bytes = log[0].buf[write.start..written_len].to_vec();
                bytes.resize(write.buffer.len(), 0);
                bytes
            };

            append(10_000, 1);
            let (no, written_len, first) = round(); // not a multiple of the block
            assert_eq!(first.buffer.as_bytes(), expected(&first, written_len));
            let pages = first.buffer.as_ptr();
            journal.round_buffer_written(first.buffer, now);
            // Arrived during the write: staged while the `fdatasync` is on its way.
            append(30_000, 2);
            journal.stage_next_round(no, written_len);
            let staged = journal.staged.get().expect("staged");
            assert_eq!(staged.upto, journal.log.borrow()[0].buf.len());
            assert!(staged.start <= written_len && written_len - staged.start < 4096);
            journal.round_written(no, written_len);
            // Arrived during the `fdatasync`: copied by the round itself.
            append(5_000, 3);
            let (no, written_len, second) = round();
            assert_eq!(
                second.buffer.as_ptr(),
                pages,
                "the staged buffer is the round's"
            );
            assert!(second.start > 0 && second.start < 10_000 + 1024);
            assert_eq!(second.buffer.as_bytes(), expected(&second, written_len));

            // More than the kept buffer holds: staged in a larger one.
            journal.round_buffer_written(second.buffer, now);
            append(600_000, 4);
            journal.stage_next_round(no, written_len);
            journal.round_written(no, written_len);
            let (no, written_len, third) = round();
            assert_ne!(third.buffer.as_ptr(), pages);
            assert_eq!(third.buffer.as_bytes(), expected(&third, written_len));

            // Staged for a round that never came (its `fdatasync` failed, say): the next
            // round starts elsewhere and copies everything.
            journal.round_buffer_written(third.buffer, now);
            append(7_000, 5);
            journal.stage_next_round(no, 0);
            journal.round_written(no, written_len);
            append(3_000, 6);
            let (_, written_len, fourth) = round();
            assert_eq!(fourth.buffer.as_bytes(), expected(&fourth, written_len));
        });
    }

    #[test]
    fn a_segment_buffer_doubles_up_to_its_full_size_and_no_further() {
        let full = 1000;
        let mut buf = Vec::with_capacity(100);
        buf.resize(90, 0);
        reserve_frames(&mut buf, 20, full);
        assert_eq!(buf.capacity(), 200, "doubled");
        buf.resize(600, 0);
        reserve_frames(&mut buf, 500, full);
        assert_eq!(
            buf.capacity(),
            1100,
            "one frame past the full size gets its room"
        );
        let mut near_full = Vec::with_capacity(800);
        near_full.resize(790, 0);
        reserve_frames(&mut near_full, 20, full);
        assert_eq!(
            near_full.capacity(),
            1000,
            "doubling stops at the full size"
        );
        reserve_frames(&mut near_full, 5, full);
        assert_eq!(near_full.capacity(), 1000, "room left: nothing to do");
    }

    /// A rotation waiting for its next WAL file leaves frames coming into a full buffer: it
    /// grows in steps of a quarter of its full size, not to each frame's end (which copied
    /// the whole segment once per frame, 8 MiB per 64 KiB append).
    #[test]
    fn a_segment_buffer_past_its_full_size_grows_in_steps_not_per_frame() {
        let full = 1000;
        let mut buf = vec![0u8; full];
        // Each change of capacity is a reallocation: a copy of the buffer, unless the
        // allocator grows the block in place.
        let mut reallocations = 0;
        for _ in 0..100 {
            let capacity = buf.capacity();
            reserve_frames(&mut buf, 10, full);
            if buf.capacity() != capacity {
                reallocations += 1;
            }
            let len = buf.len();
            buf.resize(len + 10, 0);
        }
        assert_eq!(buf.len(), 2000);
        assert!(
            reallocations <= 4,
            "{reallocations} reallocations for 100 frames past the full size"
        );
        assert!(buf.capacity() < 2500, "{}", buf.capacity());
    }
}
