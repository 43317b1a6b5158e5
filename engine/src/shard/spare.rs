//! Segment buffers kept for reuse.
//!
//! A segment's buffer grows, by doubling, to the segment size plus its slack as frames arrive.
//! Made fresh for every segment, its pages would be faulted in and zeroed by the kernel, and
//! copied at every doubling: 7 % of a node's CPU under 256-byte appends
//! (docs/decisions/2026-12-spare-segment-buffers.md). Freed, a buffer that large goes back to
//! the operating system, so the next one would pay again.
//!
//! So a sealed segment's buffer comes back here when the last holder of its bytes lets go (the
//! read cache evicting it, an upload, a response still being written), and the next segment
//! takes it with its pages in place. A core keeps at most [`SPARE_BUFFERS_MAX`] of them, and
//! none once it has opened no segment for [`SPARE_IDLE_MS`]: an idle node does not hold them.

use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::limits;

/// Spare full-size buffers one core keeps. One is taken per segment opened and one comes back
/// per segment the read cache lets go, so two cover a core appending at full speed...
const SPARE_BUFFERS_MAX: usize = 2;
/// ...within this many bytes: a node run with large segments (`--segment-size`) keeps fewer,
/// or none.
const SPARE_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Spares are dropped once no segment was opened for this long.
pub(super) const SPARE_IDLE_MS: u64 = 10_000;

/// One core's spare buffers, shared with the bytes of its sealed segments, which may be
/// dropped on any thread (the upload runtime, another core that read them). Locked once per
/// segment, never per append.
struct Spares {
    buffers: Mutex<Vec<Vec<u8>>>,
    /// A full buffer's capacity: the segment size plus its slack.
    full_bytes: usize,
    /// How many are kept.
    kept_max: usize,
}

impl Spares {
    /// A buffer of exactly the full size (made so, or grown to it by doubling): worth keeping.
    /// One grown past it (a frame larger than a segment, or a rotation that waited for its
    /// next WAL file) is let go: kept, every segment written in it would seal with more than
    /// a quarter of it spare and be copied (`SegmentBuffers::seal`), one segment after another.
    fn reusable(&self, buf: &Vec<u8>) -> bool {
        buf.capacity() == self.full_bytes
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        if !self.reusable(&buf) {
            return;
        }
        let mut buffers = self.lock();
        if buffers.len() < self.kept_max {
            buf.clear();
            buffers.push(buf);
        }
    }

    /// The spares, even after a panic elsewhere while they were locked: a list of empty
    /// buffers has no state to break.
    fn lock(&self) -> MutexGuard<'_, Vec<Vec<u8>>> {
        self.buffers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) struct SegmentBuffers {
    spares: Arc<Spares>,
    last_taken: Cell<Instant>,
}

impl SegmentBuffers {
    /// A core's buffers for segments of `segment_size`, made at `now`.
    pub(crate) fn new(segment_size: usize, now: Instant) -> SegmentBuffers {
        let full_bytes = segment_size + limits::SEGMENT_SLACK_BYTES;
        SegmentBuffers {
            spares: Arc::new(Spares {
                buffers: Mutex::default(),
                full_bytes,
                kept_max: SPARE_BUFFERS_MAX.min(SPARE_BYTES_MAX / full_bytes),
            }),
            last_taken: Cell::new(now),
        }
    }

    /// The most a segment's buffer grows to, unless one frame needs more.
    pub(super) fn full_bytes(&self) -> usize {
        self.spares.full_bytes
    }

    /// An empty buffer for a new segment: a spare one, else a fresh one. A writer that fills
    /// segments (`filling`) gets one of full capacity, whose pages it touches anyway: grown
    /// by doubling, its bytes would be copied once more (8 % of a core's CPU under 64 KiB
    /// appends). Any other gets a small one that grows on demand (a flush under object
    /// durability seals a few hundred bytes, and committing a full segment's pages up front
    /// takes 4.5 ms per segment, most of a lone writer's acknowledgement).
    pub(super) fn take(&self, now: Instant, filling: bool) -> Vec<u8> {
        self.last_taken.set(now);
        self.spares.lock().pop().unwrap_or_else(|| {
            let capacity = match filling {
                true => self.full_bytes(),
                false => limits::SEGMENT_BUFFER_INITIAL_BYTES.min(self.full_bytes()),
            };
            Vec::with_capacity(capacity)
        })
    }

    /// A sealed segment's bytes. A full buffer is shared as is and comes back here once they
    /// are dropped. A mostly empty one (a flush, a segment sealed by age) is copied to its
    /// length: the read cache counts a segment by its length, and would not see the spare
    /// capacity.
    pub(super) fn seal(&self, buf: Vec<u8>) -> Bytes {
        if buf.capacity() - buf.len() > buf.len() / 4 {
            let bytes = Bytes::copy_from_slice(&buf);
            self.spares.give_back(buf);
            return bytes;
        }
        if !self.spares.reusable(&buf) {
            return Bytes::from(buf);
        }
        Bytes::from_owner(Returning {
            buf,
            spares: Arc::downgrade(&self.spares),
        })
    }

    /// Drops the spares of a core that has opened no segment for [`SPARE_IDLE_MS`].
    pub(super) fn trim_idle(&self, now: Instant) {
        let idle = now.saturating_duration_since(self.last_taken.get());
        if idle >= Duration::from_millis(SPARE_IDLE_MS) {
            let dropped = std::mem::take(&mut *self.spares.lock());
            drop(dropped);
        }
    }

    /// Bytes held in spare buffers.
    pub(super) fn spare_bytes(&self) -> usize {
        self.spares.lock().iter().map(Vec::capacity).sum()
    }
}

/// A sealed segment's buffer, handed back to its core's spares when its bytes are dropped.
struct Returning {
    buf: Vec<u8>,
    spares: Weak<Spares>,
}

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(spares) = self.spares.upgrade() {
            spares.give_back(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGMENT: usize = 64 * 1024;

    fn full(buffers: &SegmentBuffers, fill: usize) -> Vec<u8> {
        let mut buf = Vec::with_capacity(buffers.full_bytes());
        buf.resize(fill, 7);
        buf
    }

    #[test]
    fn a_full_segment_s_buffer_comes_back_when_its_bytes_are_dropped() {
        let buffers = SegmentBuffers::new(SEGMENT, Instant::now());
        let buf = full(&buffers, buffers.full_bytes() - 10);
        let at = buf.as_ptr();
        let bytes = buffers.seal(buf);
        assert_eq!(bytes.as_ptr(), at, "shared as is, not copied");
        let slice = bytes.slice(5..50);
        drop(bytes);
        assert_eq!(buffers.spare_bytes(), 0, "a slice still holds it");
        assert!(slice.iter().all(|&b| b == 7));
        drop(slice);
        assert_eq!(buffers.spare_bytes(), buffers.full_bytes());
        let again = buffers.take(Instant::now(), false);
        assert_eq!(
            (again.as_ptr(), again.len()),
            (at, 0),
            "the same pages, emptied"
        );
    }

    #[test]
    fn a_mostly_empty_buffer_is_copied_to_its_length_and_kept() {
        let buffers = SegmentBuffers::new(SEGMENT, Instant::now());
        let buf = full(&buffers, 300);
        let bytes = buffers.seal(buf);
        assert_eq!(bytes.len(), 300);
        assert!(bytes.iter().all(|&b| b == 7));
        assert_eq!(buffers.spare_bytes(), buffers.full_bytes(), "kept at once");
    }

    #[test]
    fn a_writer_filling_segments_gets_a_full_buffer_that_never_grows_by_a_copy() {
        let buffers = SegmentBuffers::new(SEGMENT, Instant::now());
        let mut buf = buffers.take(Instant::now(), true);
        assert_eq!(buf.capacity(), buffers.full_bytes());
        let at = buf.as_ptr();
        let room = buf.capacity();
        super::super::journal::reserve_frames(&mut buf, room, buffers.full_bytes());
        buf.resize(room, 7);
        assert_eq!(buf.as_ptr(), at, "filled where it was made");
        let bytes = buffers.seal(buf);
        assert_eq!(bytes.as_ptr(), at, "and shared as is");
    }

    #[test]
    fn small_and_oversized_buffers_are_not_kept() {
        let buffers = SegmentBuffers::new(SEGMENT, Instant::now());
        let growing = buffers.take(Instant::now(), false);
        assert!(growing.capacity() < buffers.full_bytes());
        drop(buffers.seal(growing));
        let mut oversized = Vec::with_capacity(buffers.full_bytes() * 2);
        oversized.resize(buffers.full_bytes() * 2 - 1, 1);
        drop(buffers.seal(oversized));
        assert_eq!(buffers.spare_bytes(), 0);
    }

    /// What a rotation that waited for its next WAL file leaves: a buffer grown past its full
    /// size (`journal::reserve_frames`). Kept, each later segment of a writer filling
    /// segments sealed with more than a quarter of it spare and was copied whole (8 MiB per
    /// segment under 64 KiB appends, 3-5 % of a core); let go, the next segment gets a buffer
    /// of full size and is shared as is.
    #[test]
    fn a_buffer_grown_past_its_full_size_is_let_go_and_the_next_segments_are_not_copied() {
        // The default segment size: its slack is an eighth of it.
        let buffers = SegmentBuffers::new(8 * 1024 * 1024, Instant::now());
        let segment_len = buffers.full_bytes() - limits::SEGMENT_SLACK_BYTES;
        let mut grown = full(&buffers, buffers.full_bytes());
        super::super::journal::reserve_frames(&mut grown, 100, buffers.full_bytes());
        assert!(grown.capacity() > buffers.full_bytes());
        grown.truncate(segment_len);
        drop(buffers.seal(grown));
        assert_eq!(buffers.spare_bytes(), 0, "not kept");
        for _ in 0..3 {
            let mut next = buffers.take(Instant::now(), true);
            assert_eq!(next.capacity(), buffers.full_bytes());
            next.resize(segment_len, 7);
            let at = next.as_ptr();
            let bytes = buffers.seal(next);
            assert_eq!(bytes.as_ptr(), at, "shared as is, not copied");
        }
    }

    #[test]
    fn a_core_keeps_a_few_spares_and_drops_them_when_idle() {
        let buffers = SegmentBuffers::new(SEGMENT, Instant::now());
        let sealed: Vec<Bytes> = (0..5)
            .map(|_| buffers.seal(full(&buffers, buffers.full_bytes())))
            .collect();
        drop(sealed);
        assert_eq!(
            buffers.spare_bytes(),
            SPARE_BUFFERS_MAX * buffers.full_bytes()
        );
        buffers.trim_idle(Instant::now());
        assert_eq!(
            buffers.spare_bytes(),
            SPARE_BUFFERS_MAX * buffers.full_bytes(),
            "not idle yet"
        );
        buffers
            .last_taken
            .set(Instant::now() - Duration::from_millis(SPARE_IDLE_MS));
        buffers.trim_idle(Instant::now());
        assert_eq!(buffers.spare_bytes(), 0);
    }

    #[test]
    fn large_segments_keep_fewer_spares_or_none() {
        let two = SegmentBuffers::new(
            SPARE_BYTES_MAX / 2 - limits::SEGMENT_SLACK_BYTES,
            Instant::now(),
        );
        let one = SegmentBuffers::new(
            SPARE_BYTES_MAX - limits::SEGMENT_SLACK_BYTES,
            Instant::now(),
        );
        let none = SegmentBuffers::new(SPARE_BYTES_MAX, Instant::now());
        for (buffers, kept) in [(two, 2), (one, 1), (none, 0)] {
            let sealed: Vec<Bytes> = (0..3)
                .map(|_| buffers.seal(full(&buffers, buffers.full_bytes())))
                .collect();
            drop(sealed);
            assert_eq!(buffers.spare_bytes(), kept * buffers.full_bytes());
        }
    }

    #[test]
    fn bytes_dropped_on_another_thread_come_back_too() {
        let buffers = SegmentBuffers::new(SEGMENT, Instant::now());
        let bytes = buffers.seal(full(&buffers, buffers.full_bytes()));
        std::thread::spawn(move || drop(bytes)).join().unwrap();
        assert_eq!(buffers.spare_bytes(), buffers.full_bytes());
    }

    #[test]
    fn bytes_outliving_their_core_are_freed() {
        let buffers = SegmentBuffers::new(SEGMENT, Instant::now());
        let bytes = buffers.seal(full(&buffers, buffers.full_bytes()));
        drop(buffers);
        assert_eq!(bytes.len(), SEGMENT + limits::SEGMENT_SLACK_BYTES);
        drop(bytes);
    }
}
