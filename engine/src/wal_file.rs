//! The WAL file format, and the scan that tells what a WAL file holds after a crash: which
//! frames were acknowledged, whether its end was torn by the crash, or whether it was damaged
//! after it was written (a flipped bit, a bad sector) so that acknowledged records are lost.
//!
//! ```text
//!  version 2 (written by this build): a segment's bytes, as its object gets them
//!  +------------------------------------------+-------+--------+-------------- ... -+--------+------+
//!  | round 1: data frames (records, closes)   | epoch | commit | round 2 ...        | commit | 0 ...|
//!  |                                          | 40 B… | 40 B   |                    | 40 B   |      |
//!  +------------------------------------------+-------+--------+-------------- ... -+--------+------+
//!  commit:      a frame header (`frame.rs`), kind FRAME_KIND_WAL_COMMIT, no payload,
//!               stream_id = round number (1, 2, ...), offset = this record's own position in
//!               the file, timestamp_ms = when it was written
//!  epoch:       (cluster nodes) a frame header, kind FRAME_KIND_WAL_EPOCH, no payload,
//!               stream_id = a stream, offset = the owner epoch its frames in this file were
//!               written at; in the round of the stream's first frame in the file, before the
//!               commit record (a file never holds frames of two incarnations of a stream)
//!  A round is one group commit: one durable write (RWF_DSYNC). Nothing of a round is
//!  acknowledged before its commit record is on disk with the rest of it. Readers of a
//!  segment skip these records as they skip other streams' frames (by kind), so the sealed
//!  WAL file is the segment object as it is (a file:// bucket links it).
//!  A file header (kind FRAME_KIND_WAL_FILE, stream_id = its format version) is how a later
//!  format announces itself; this build writes none and refuses any version but its own.
//!
//!  version 1 (releases before commit records): data frames only, a request's last frame
//!  flagged FLAG_REQUEST_END, then zeros. A file with any commit record is version 2.
//! ```
//!
//! Files are pre-allocated with zeros and written in order, one round at a time (the next
//! round starts only after the previous one's durable write completed). A power cut can
//! therefore tear only the last round; every round before it was whole on disk before the next one began. So when
//! the scan meets bytes that are not a valid frame at position P:
//! - no commit record of a later round lies anywhere past P: the crash tore the last round,
//!   which was never acknowledged. The committed rounds are kept, the rest dropped.
//! - a commit record of a round after P's round lies past P, or the round that P is in has
//!   its commit record past P: P is inside a round that was (or may have been) acknowledged.
//!   That is damage, never a clean end: the scan reports it with what it found past it.
//!
//! Damage inside the 40-byte commit record of the very last round cannot be told from a torn
//! write of that record; docs/durability.md says so.

use crate::frame::{
    check_frame, encode_frame, FrameHeader, FrameMeta, FRAME_HEADER_LEN, FRAME_KIND_CLOSE,
    FRAME_KIND_RECORD,
};
use zerocopy::byteorder::little_endian::{I64, U16, U32, U64};
use zerocopy::IntoBytes;

/// The WAL format this build writes; stable, persisted in each file's header.
pub const WAL_FORMAT_VERSION: u64 = 2;
/// Stable, persisted: the file header a later format starts with.
pub const FRAME_KIND_WAL_FILE: u8 = 3;
/// Stable, persisted: the end of one group-commit round.
pub const FRAME_KIND_WAL_COMMIT: u8 = 4;
/// Stable, persisted: the owner epoch of a stream's frames in this file. Recovery fences the
/// file's frames by it: a stream that moved away and back while this node was down is another
/// incarnation, and these frames are not its.
pub const FRAME_KIND_WAL_EPOCH: u8 = 5;
/// Bytes of a file header, a commit record and an epoch record.
pub const WAL_MARKER_LEN: usize = FRAME_HEADER_LEN;

/// A frame header with no payload (file header or commit record), CRC filled in.
fn marker(kind: u8, stream_id: u64, offset: u64, timestamp_ms: i64) -> [u8; WAL_MARKER_LEN] {
    let header = FrameHeader {
        len: U32::new(WAL_MARKER_LEN as u32),
        crc: U32::new(0),
        kind,
        flags: 0,
        producer_len: U16::new(0),
        headers_len: U32::new(0),
        stream_id: U64::new(stream_id),
        offset: U64::new(offset),
        timestamp_ms: I64::new(timestamp_ms),
    };
    let mut bytes = [0u8; WAL_MARKER_LEN];
    bytes.copy_from_slice(header.as_bytes());
    let crc = crc32c::crc32c(&bytes[8..]);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// The header of a WAL file of format `version` (this build writes none; a later format
/// would, and this build refuses it).
pub fn file_header(version: u64, created_ms: i64) -> [u8; WAL_MARKER_LEN] {
    marker(FRAME_KIND_WAL_FILE, version, 0, created_ms)
}

/// The commit record that ends round `round` (from 1), written at file position `at`.
pub fn commit_record(round: u64, at: u64, now_ms: i64) -> [u8; WAL_MARKER_LEN] {
    marker(FRAME_KIND_WAL_COMMIT, round, at, now_ms)
}

/// Ends round `round` of a segment's bytes: the epoch records of `epochs` (stream id, owner
/// epoch), then the commit record. What a commit round writes after its frames.
pub fn end_round(buf: &mut Vec<u8>, round: u64, epochs: &[(u64, u64)], now_ms: i64) {
    for (stream_id, epoch) in epochs {
        buf.extend_from_slice(&epoch_record(*stream_id, *epoch));
    }
    let at = buf.len() as u64;
    buf.extend_from_slice(&commit_record(round, at, now_ms));
}

/// The record saying stream `stream_id`'s frames in this file are of owner epoch `epoch`.
pub fn epoch_record(stream_id: u64, epoch: u64) -> [u8; WAL_MARKER_LEN] {
    marker(FRAME_KIND_WAL_EPOCH, stream_id, epoch, 0)
}

/// One valid data frame the scan found: where it is in the file and what it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoundFrame {
    pub pos: usize,
    pub len: usize,
    pub kind: u8,
    pub stream_id: u64,
    pub offset: u64,
    /// The last frame of its request (what version 1 keeps whole).
    pub request_end: bool,
}

/// Bytes past the last good frame that are not a valid frame, yet lie before data that was
/// (or may have been) acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// File position of the first byte that is not a valid frame.
    pub at: usize,
    /// Where valid frames start again past it, if they do (the damaged bytes are `at..this`).
    pub resumes_at: Option<usize>,
    /// What was wrong at `at`, and why it is not a torn end.
    pub why: String,
    /// The stream and offset the damaged frame's header names, when its length leads exactly
    /// to the next valid frame (only its payload was hit, so the header is likely right).
    pub claimed: Option<(u64, u64)>,
    /// The damaged bytes are exactly one commit record (by its header): no record was in them.
    pub commit_record_only: bool,
    /// The file was cut short (its bytes end inside a frame or a round): every round after
    /// `at` is gone with its bytes, so which streams lost records there cannot be known.
    pub cut: bool,
    /// The valid frames before `at`, in file order (kept by a salvage).
    pub before: Vec<FoundFrame>,
    /// The valid data frames found past the damage, in file order.
    pub after: Vec<FoundFrame>,
}

/// How a WAL file ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalEnd {
    /// After the last whole round there are only zeros.
    Clean,
    /// The last round was cut by the crash: `dropped` bytes past the last commit (never
    /// acknowledged) are not kept.
    Torn { dropped: usize },
    /// Damaged: acknowledged records past `at` cannot be read in order.
    Damaged(Damage),
}

/// What a WAL file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scanned {
    /// The file's format version (1 for files without a header).
    pub version: u64,
    /// The data frames of every whole round (version 1: every whole request) before the end
    /// or the damage, in order, as file positions.
    pub committed: Vec<FoundFrame>,
    /// Where the file's frames start (past a file header, if any).
    pub start: usize,
    /// File position just past the last whole round (its commit record; version 1: its last
    /// whole request): where the next round would have started.
    pub committed_end: usize,
    /// The owner epoch of each stream's frames, from the epoch records of whole rounds
    /// (cluster nodes write them; empty otherwise).
    pub epochs: std::collections::HashMap<u64, u64>,
    pub end: WalEnd,
}

impl Scanned {
    /// The whole rounds' bytes, commit and epoch records included: the segment object a
    /// running core would have stored of them.
    pub fn segment_bytes<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        &data[self.start..self.committed_end]
    }
}

fn found(header: &FrameHeader, pos: usize, len: usize) -> FoundFrame {
    FoundFrame {
        pos,
        len,
        kind: header.kind,
        stream_id: header.stream_id.get(),
        offset: header.offset.get(),
        request_end: header.flags & crate::frame::FLAG_REQUEST_END != 0,
    }
}

fn is_data(kind: u8) -> bool {
    kind == FRAME_KIND_RECORD || kind == FRAME_KIND_CLOSE
}

/// Whether a valid frame of a known kind starts at `pos`. Cheap tests first, so a scan of
/// every position past a damage stays linear in practice.
fn valid_frame_at(data: &[u8], pos: usize) -> Option<(FrameHeader, usize)> {
    let head = data.get(pos..pos + FRAME_HEADER_LEN)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let kind = head[8];
    let known_kind = is_data(kind) || kind == FRAME_KIND_WAL_COMMIT || kind == FRAME_KIND_WAL_EPOCH;
    if !known_kind || head[9] & !7 != 0 || len < FRAME_HEADER_LEN || len > data.len() - pos {
        return None;
    }
    check_frame(data, pos).ok()
}

/// The valid data frames past `from`, found by trying every position and then following
/// frames from each one found; and where the first one starts.
fn resync(data: &[u8], from: usize) -> (Option<usize>, Vec<FoundFrame>, u64) {
    let (mut pos, mut first, mut frames, mut last_round) = (from, None, Vec::new(), 0);
    while pos + FRAME_HEADER_LEN <= data.len() {
        match valid_frame_at(data, pos) {
            Some((header, len)) => {
                first.get_or_insert(pos);
                if is_data(header.kind) {
                    frames.push(found(&header, pos, len));
                } else {
                    last_round = last_round.max(header.stream_id.get());
                }
                pos += len;
            }
            None => pos += 1,
        }
    }
    (first, frames, last_round)
}

fn all_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

/// Whether the frame `rest` starts with declares more bytes than the file has left (or the
/// file ends inside its length field). Every frame a node writes fits in its pre-allocated
/// file, so only a cut file has one. The rest of its header must hold something: a length
/// alone in zeros is a flipped bit past the last round, not a frame.
fn runs_past_end(rest: &[u8]) -> bool {
    match rest.get(..4) {
        None => true,
        Some(len) => {
            let header_rest = &rest[4..rest.len().min(FRAME_HEADER_LEN)];
            u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize > rest.len()
                && (header_rest.is_empty() || !all_zero(header_rest))
        }
    }
}

/// A WAL file this build cannot read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanError {
    /// Its header names a format version this build does not read (a newer release wrote it).
    UnknownVersion { version: u64 },
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanError::UnknownVersion { version } => write!(
                f,
                "WAL format version {version}, but this build reads versions 1 and \
                 {WAL_FORMAT_VERSION}: start the release that wrote it, or a newer one"
            ),
        }
    }
}

impl std::error::Error for ScanError {}

/// Reads what a WAL file holds (see the module comment for the rules). `Err` for a file of
/// another format than this build reads.
pub fn scan(data: &[u8]) -> Result<Scanned, ScanError> {
    let header = check_frame(data, 0)
        .ok()
        .filter(|(h, len)| h.kind == FRAME_KIND_WAL_FILE && *len == WAL_MARKER_LEN);
    if let Some((header, _)) = header {
        let version = header.stream_id.get();
        if version != WAL_FORMAT_VERSION {
            return Err(ScanError::UnknownVersion { version });
        }
    }
    let start = if header.is_some() { WAL_MARKER_LEN } else { 0 };
    let mut pos = start;
    // Every data frame walked; how many of them whole rounds hold, and whole requests.
    let mut frames: Vec<FoundFrame> = Vec::new();
    let (mut in_rounds, mut in_requests) = (0, 0);
    let (mut rounds_end, mut requests_end) = (pos, pos);
    let (mut epochs, mut pending_epochs) = (std::collections::HashMap::new(), Vec::new());
    let mut round = 0u64;
    // Why the walk stopped, when it stopped on a valid frame that breaks the rules.
    let mut broken: Option<String> = None;
    while let Ok((header, len)) = check_frame(data, pos) {
        let kind = header.kind;
        if is_data(kind) {
            let frame = found(&header, pos, len);
            frames.push(frame);
            if frame.request_end {
                in_requests = frames.len();
                requests_end = pos + len;
            }
        } else if kind == FRAME_KIND_WAL_COMMIT {
            let (claimed_round, claimed_at) = (header.stream_id.get(), header.offset.get());
            if claimed_round != round + 1 || claimed_at != pos as u64 {
                broken = Some(format!(
                    "commit record of round {claimed_round} (at byte {claimed_at}) follows \
                     round {round}, at byte {pos}"
                ));
                break;
            }
            round += 1;
            in_rounds = frames.len();
            rounds_end = pos + len;
            epochs.extend(pending_epochs.drain(..));
        } else if kind == FRAME_KIND_WAL_EPOCH {
            pending_epochs.push((header.stream_id.get(), header.offset.get()));
        } else {
            broken = Some(format!("a frame of unknown kind {kind}"));
            break;
        }
        pos += len;
    }
    let at = pos;
    let rest = data.get(at..).unwrap_or_default();
    let (resumes_at, after, last_round) = if all_zero(rest) {
        (None, Vec::new(), 0)
    } else {
        resync(data, at + 1)
    };
    // Commit records anywhere make it version 2; without any it is version 1 (or a version-2
    // file whose first round was cut: its whole requests were never acknowledged, and
    // keeping them finds them at most once).
    let version = if header.is_some() || round > 0 || last_round > 0 || broken.is_some() {
        WAL_FORMAT_VERSION
    } else {
        1
    };
    let (kept, committed_end) = if version == 1 {
        (in_requests, requests_end)
    } else {
        (in_rounds, rounds_end)
    };
    let pending = frames.split_off(kept);
    let committed = frames;
    // A WAL file is pre-allocated when it is made, and only ever cut at the end of a whole
    // round (a file:// bucket's upload links the sealed file as its object). A crash tears a
    // round inside the file's length and leaves zeros past it; bytes that run out inside a
    // frame, or frames past the last whole round that reach the very end of the file, mean
    // the file was cut after it was written.
    let cut = !all_zero(rest) && runs_past_end(rest) || (at == data.len() && at > committed_end);
    let damaged_why = if let Some(why) = broken {
        Some(why)
    } else if cut {
        Some(format!(
            "the file ends at byte {}, inside {}: a WAL file is pre-allocated and never \
             shortened by a crash, so it was cut after it was written, and what followed is gone",
            data.len(),
            if at == data.len() {
                format!(
                    "round {} (its frames reach the end, its commit record is missing)",
                    round + 1
                )
            } else {
                format!("the frame that starts at byte {at}")
            }
        ))
    } else if version == WAL_FORMAT_VERSION && last_round > round {
        Some(format!(
            "the bytes after round {round} are not a valid frame, yet round {last_round}'s \
             commit record follows them"
        ))
    } else if version == 1 && !after.is_empty() {
        Some("the bytes there are not a valid frame, yet valid frames follow them".to_string())
    } else {
        None
    };
    let Some(why) = damaged_why else {
        let dropped = data[committed_end..]
            .iter()
            .rposition(|b| *b != 0)
            .map_or(0, |i| i + 1);
        let end = if dropped == 0 {
            WalEnd::Clean
        } else {
            WalEnd::Torn { dropped }
        };
        return Ok(Scanned {
            version,
            committed,
            start,
            committed_end,
            epochs,
            end,
        });
    };
    // The damaged frame's own header, when its length leads exactly to the next valid frame
    // (or, in a cut file, past the end: the frame the cut went through).
    let header_at = data.get(at..at + FRAME_HEADER_LEN).and_then(|head| {
        let header: FrameHeader = zerocopy::FromBytes::read_from_bytes(head).ok()?;
        let end = at + header.len.get() as usize;
        let believed = match resumes_at {
            Some(next) => end == next,
            None => cut && end > data.len(),
        };
        believed.then_some(header)
    });
    let claimed = header_at
        .filter(|h| is_data(h.kind))
        .map(|h| (h.stream_id.get(), h.offset.get()));
    let commit_record_only = header_at.is_some_and(|h| h.kind == FRAME_KIND_WAL_COMMIT);
    let mut before = committed.clone();
    before.extend_from_slice(&pending);
    Ok(Scanned {
        version,
        committed,
        start,
        committed_end,
        epochs,
        end: WalEnd::Damaged(Damage {
            at,
            resumes_at,
            why,
            claimed,
            commit_record_only,
            cut,
            before,
            after,
        }),
    })
}

/// A close frame for `stream_id` at `offset` (its next offset), as a salvage writes it for a
/// stream that lost acknowledged records, so its lost offsets are never handed out again.
pub fn salvage_close(out: &mut Vec<u8>, stream_id: u64, offset: u64, now_ms: i64) {
    let meta = FrameMeta {
        kind: FRAME_KIND_CLOSE,
        stream_id,
        offset,
        timestamp_ms: now_ms,
        request_end: true,
        producer: None,
        writer_seq: None,
    };
    encode_frame(out, meta, &[], &[]);
}

#[cfg(test)]
mod tests;
