//! Record frames: the one byte format of the WAL, of sealed segments and of what reads decode.
//!
//! ```text
//!  0       4       8     9     10      12      16              24              32              40
//!  +-------+-------+-----+-----+-------+-------+---------------+---------------+---------------+---------+----------+------+
//!  | len   | crc   |kind |flags|prd_len|hdr_len| stream_id     | offset        | timestamp_ms  | headers | producer | body |
//!  | u32   | u32   | u8  | u8  | u16   | u32   | u64           | u64           | i64           | hdr_len | prd_len  |      |
//!  +-------+-------+-----+-----+-------+-------+---------------+---------------+---------------+---------+----------+------+
//!  all integers little-endian
//!  len   = bytes of the whole frame (FRAME_HEADER_LEN + hdr_len + prd_len + body length)
//!  crc   = CRC32C of bytes [8, len): a torn or corrupt frame fails it
//!  kind  = FRAME_KIND_RECORD (one record at `offset`) or FRAME_KIND_CLOSE (the stream closed
//!          at `offset` = its next offset; no headers, no body)
//!  flags = FLAG_REQUEST_END on the last frame of one append request: recovery keeps whole
//!          requests only, so a multi-record append is atomic across a crash;
//!          FLAG_PRODUCER when a producer block is present (only on a request's last frame,
//!          so the producer's sequence is durable exactly when all of its records are);
//!          FLAG_WRITER_SEQ when a writer sequence (`Stream-Seq`) follows it (same rule)
//!  producer region (prd_len bytes) = [producer block] [writer seq block]
//!  producer block:   epoch u64 | seq u64 | producer id (UTF-8)        if FLAG_PRODUCER
//!  writer seq block: writer seq (UTF-8) | its length u16              if FLAG_WRITER_SEQ
//!                    (length last, so the producer id's length is what remains)
//!  headers block (record headers, may be empty):
//!  +-----------+-----------------------------------------------------------------+
//!  | count u32 | count × ( name_len u32 | name | value_len u32 | value )        |
//!  +-----------+-----------------------------------------------------------------+
//! ```
//!
//! A `len` of zero is where the frames written so far end: WAL files are pre-allocated with
//! zeros and DMA writes pad the last block with zeros. Only `wal_file::scan` decides whether
//! that end is the file's true end, a torn write or damage. The WAL adds two kinds of its own
//! (file header, commit record) that never reach a segment object (`wal_file.rs`).

use bytes::Bytes;
use zerocopy::byteorder::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of [`FrameHeader`] on disk.
pub const FRAME_HEADER_LEN: usize = 40;
/// Stable, persisted.
pub const FRAME_KIND_RECORD: u8 = 1;
/// Stable, persisted.
pub const FRAME_KIND_CLOSE: u8 = 2;
/// Stable, persisted: the last frame of an append request.
pub const FLAG_REQUEST_END: u8 = 1;
/// Stable, persisted: the frame carries a producer block.
pub const FLAG_PRODUCER: u8 = 2;
/// Stable, persisted: the frame carries a writer sequence block.
pub const FLAG_WRITER_SEQ: u8 = 4;
/// Longest writer sequence (`Stream-Seq`) a frame carries.
pub const WRITER_SEQ_LEN_MAX: usize = 1024;
/// Bytes of a producer block before the id.
const PRODUCER_FIXED_LEN: usize = 16;
/// Longest producer id a frame can carry (room is left for a writer sequence).
pub const PRODUCER_ID_LEN_MAX: usize =
    u16::MAX as usize - PRODUCER_FIXED_LEN - WRITER_SEQ_LEN_MAX - 2;

/// The fixed frame header, read and written in place (see the module diagram).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct FrameHeader {
    pub len: U32,
    pub crc: U32,
    pub kind: u8,
    pub flags: u8,
    pub producer_len: U16,
    pub headers_len: U32,
    pub stream_id: U64,
    pub offset: U64,
    pub timestamp_ms: I64,
}

const _: () = assert!(std::mem::size_of::<FrameHeader>() == FRAME_HEADER_LEN);

/// One record header, name and value as given by the client (UTF-8 checked by the protocol layer).
pub type RecordHeader = (Bytes, Bytes);

/// Bytes the headers block of `headers` takes (0 when there are none).
pub fn headers_block_len(headers: &[RecordHeader]) -> usize {
    if headers.is_empty() {
        return 0;
    }
    4 + headers
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len())
        .sum::<usize>()
}

/// An idempotent producer's tuple as written in a frame.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProducerTuple {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

/// The fixed fields of a frame to encode.
#[derive(Clone, Copy, Debug)]
pub struct FrameMeta<'a> {
    pub kind: u8,
    pub stream_id: u64,
    pub offset: u64,
    pub timestamp_ms: i64,
    /// The last frame of a request (sets FLAG_REQUEST_END).
    pub request_end: bool,
    pub producer: Option<&'a ProducerTuple>,
    pub writer_seq: Option<&'a str>,
}

fn producer_block_len(producer: Option<&ProducerTuple>, writer_seq: Option<&str>) -> usize {
    producer.map_or(0, |p| PRODUCER_FIXED_LEN + p.id.len()) + writer_seq.map_or(0, |w| w.len() + 2)
}

/// Bytes a frame takes.
pub fn frame_len(
    headers: &[RecordHeader],
    producer: Option<&ProducerTuple>,
    writer_seq: Option<&str>,
    body_len: usize,
) -> usize {
    FRAME_HEADER_LEN
        + headers_block_len(headers)
        + producer_block_len(producer, writer_seq)
        + body_len
}

/// Appends one frame to `out`. The only copy of the body on the write path.
pub fn encode_frame(out: &mut Vec<u8>, meta: FrameMeta<'_>, headers: &[RecordHeader], body: &[u8]) {
    let start = out.len();
    let headers_len = headers_block_len(headers);
    let producer_len = producer_block_len(meta.producer, meta.writer_seq);
    debug_assert!(
        producer_len <= u16::MAX as usize,
        "producer ids are checked against PRODUCER_ID_LEN_MAX"
    );
    let len = FRAME_HEADER_LEN + headers_len + producer_len + body.len();
    let mut flags = 0;
    if meta.request_end {
        flags |= FLAG_REQUEST_END;
    }
    if meta.producer.is_some() {
        flags |= FLAG_PRODUCER;
    }
    if meta.writer_seq.is_some() {
        flags |= FLAG_WRITER_SEQ;
    }
    let header = FrameHeader {
        len: U32::new(len as u32),
        crc: U32::new(0),
        kind: meta.kind,
        flags,
        producer_len: U16::new(producer_len as u16),
        headers_len: U32::new(headers_len as u32),
        stream_id: U64::new(meta.stream_id),
        offset: U64::new(meta.offset),
        timestamp_ms: I64::new(meta.timestamp_ms),
    };
    out.extend_from_slice(header.as_bytes());
    if !headers.is_empty() {
        out.extend_from_slice(&(headers.len() as u32).to_le_bytes());
        for (name, value) in headers {
            out.extend_from_slice(&(name.len() as u32).to_le_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
        }
    }
    if let Some(producer) = meta.producer {
        out.extend_from_slice(&producer.epoch.to_le_bytes());
        out.extend_from_slice(&producer.seq.to_le_bytes());
        out.extend_from_slice(producer.id.as_bytes());
    }
    if let Some(writer_seq) = meta.writer_seq {
        out.extend_from_slice(writer_seq.as_bytes());
        out.extend_from_slice(&(writer_seq.len() as u16).to_le_bytes());
    }
    out.extend_from_slice(body);
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the header or than `len` says: a torn tail.
    Truncated,
    /// A `len` of zero: the zero-filled end of a WAL file.
    End,
    /// `len` smaller than a header or headers larger than the frame.
    BadLength,
    /// The CRC does not match: torn or corrupt.
    BadChecksum,
}

/// A decoded frame; `headers` and `body` share the buffer they were decoded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream_id: u64,
    pub offset: u64,
    pub timestamp_ms: i64,
    /// The raw headers block (see the module diagram); empty when the record has none.
    pub headers: Bytes,
    pub producer: Option<ProducerTuple>,
    pub writer_seq: Option<String>,
    pub body: Bytes,
}

impl Frame {
    pub fn request_end(&self) -> bool {
        self.flags & FLAG_REQUEST_END != 0
    }
}

/// Reads the header at `pos` of `buf` and checks its length and CRC; returns it and the frame length.
pub fn check_frame(buf: &[u8], pos: usize) -> Result<(FrameHeader, usize), FrameError> {
    check_frame_with(buf, pos, true)
}

fn check_frame_with(
    buf: &[u8],
    pos: usize,
    verify_crc: bool,
) -> Result<(FrameHeader, usize), FrameError> {
    let rest = buf.get(pos..).ok_or(FrameError::Truncated)?;
    if rest.len() >= 4 && rest[..4] == [0, 0, 0, 0] {
        return Err(FrameError::End);
    }
    let (header, _) = FrameHeader::read_from_prefix(rest).map_err(|_| FrameError::Truncated)?;
    let len = header.len.get() as usize;
    let payload = header.headers_len.get() as usize + header.producer_len.get() as usize;
    let region = header.producer_len.get() as usize;
    let producer_ok = match header.flags & (FLAG_PRODUCER | FLAG_WRITER_SEQ) {
        0 => region == 0,
        FLAG_PRODUCER => region >= PRODUCER_FIXED_LEN,
        FLAG_WRITER_SEQ => region >= 2,
        _ => region >= PRODUCER_FIXED_LEN + 2,
    };
    if len < FRAME_HEADER_LEN || payload > len - FRAME_HEADER_LEN || !producer_ok {
        return Err(FrameError::BadLength);
    }
    if rest.len() < len {
        return Err(FrameError::Truncated);
    }
    if verify_crc && crc32c::crc32c(&rest[8..len]) != header.crc.get() {
        return Err(FrameError::BadChecksum);
    }
    Ok((header, len))
}

/// Decodes the frame at `pos` of `buf` without copying its payload.
pub fn decode_frame(buf: &Bytes, pos: usize) -> Result<(Frame, usize), FrameError> {
    let (header, len) = check_frame(buf, pos)?;
    Ok((frame_at(buf, pos, &header, len), len))
}

/// The frame at `pos` whose header [`check_frame`] already read and checked (length and CRC),
/// so a reader that looks at headers first does not checksum the frames it keeps twice.
pub fn frame_at(buf: &Bytes, pos: usize, header: &FrameHeader, len: usize) -> Frame {
    let headers_end = pos + FRAME_HEADER_LEN + header.headers_len.get() as usize;
    let producer_end = headers_end + header.producer_len.get() as usize;
    // The writer seq block ends the region (its length last); the producer block is the rest.
    let mut block_end = producer_end;
    let mut writer_seq = None;
    if header.flags & FLAG_WRITER_SEQ != 0 {
        let len = u16::from_le_bytes([buf[producer_end - 2], buf[producer_end - 1]]) as usize;
        let start = (producer_end - 2).saturating_sub(len).max(headers_end);
        writer_seq = Some(String::from_utf8_lossy(&buf[start..producer_end - 2]).into_owned());
        block_end = start;
    }
    let producer = (header.flags & FLAG_PRODUCER != 0
        && block_end - headers_end >= PRODUCER_FIXED_LEN)
        .then(|| {
            let block = &buf[headers_end..block_end];
            ProducerTuple {
                epoch: u64::from_le_bytes(block[..8].try_into().expect("8 bytes")),
                seq: u64::from_le_bytes(block[8..16].try_into().expect("8 bytes")),
                id: String::from_utf8_lossy(&block[16..]).into_owned(),
            }
        });
    Frame {
        kind: header.kind,
        flags: header.flags,
        stream_id: header.stream_id.get(),
        offset: header.offset.get(),
        timestamp_ms: header.timestamp_ms.get(),
        headers: buf.slice(pos + FRAME_HEADER_LEN..headers_end),
        producer,
        writer_seq,
        body: buf.slice(producer_end..pos + len),
    }
}

/// Scans frames laid end to end over `pieces`: consecutive slices of one byte range, such as
/// the cache blocks a sealed chunk spans. A frame inside one piece is a slice of it; only a frame
/// cut by a piece boundary is copied, so a reader never joins whole blocks to read across them.
/// The first error ends the scan (what follows a bad frame cannot be framed).
pub struct SplitFrames<'a> {
    pieces: &'a [Bytes],
    piece: usize,
    pos: usize,
    verify_crc: bool,
    /// The last frame cut by a boundary, copied whole.
    joined: Bytes,
    failed: bool,
}

/// One frame [`SplitFrames`] found: `header` and `len` as [`check_frame`] returns them, at
/// `pos` of `buf` (give them to [`frame_at`]).
pub struct SplitFrame<'b> {
    pub buf: &'b Bytes,
    pub pos: usize,
    pub header: FrameHeader,
    pub len: usize,
}

impl<'a> SplitFrames<'a> {
    /// `verify_crc` false skips the CRC, for bytes this process framed itself and still holds
    /// in memory, or checked since it fetched them (nothing could have corrupted them since).
    pub fn new(pieces: &'a [Bytes], verify_crc: bool) -> SplitFrames<'a> {
        SplitFrames {
            pieces,
            piece: 0,
            pos: 0,
            verify_crc,
            joined: Bytes::new(),
            failed: false,
        }
    }

    /// The next frame, `None` at the end of the last piece, or the error that ends the scan.
    pub fn next_frame(&mut self) -> Option<Result<SplitFrame<'_>, FrameError>> {
        if self.failed {
            return None;
        }
        while self.pos >= self.pieces.get(self.piece)?.len() {
            self.piece += 1;
            self.pos = 0;
        }
        let pieces = self.pieces;
        let buf = &pieces[self.piece];
        let (joined, checked) = match check_frame_with(buf, self.pos, self.verify_crc) {
            Err(FrameError::Truncated) if self.piece + 1 < pieces.len() => (true, self.join()),
            checked => (false, checked),
        };
        let (header, len) = match checked {
            Ok(found) => found,
            Err(e) => {
                self.failed = true;
                return Some(Err(e));
            }
        };
        if joined {
            return Some(Ok(SplitFrame {
                buf: &self.joined,
                pos: 0,
                header,
                len,
            }));
        }
        let pos = self.pos;
        self.pos += len;
        Some(Ok(SplitFrame {
            buf,
            pos,
            header,
            len,
        }))
    }

    /// Copies the frame that starts at the cursor and runs into the next pieces, as many
    /// bytes as its `len` claims (at least a header, at most what is left), and checks it.
    fn join(&mut self) -> Result<(FrameHeader, usize), FrameError> {
        let left = self.pieces[self.piece..]
            .iter()
            .map(Bytes::len)
            .sum::<usize>()
            - self.pos;
        let mut joined = Vec::new();
        self.take_into(&mut joined, left.min(4));
        let Ok(len_bytes) = <[u8; 4]>::try_from(&joined[..]) else {
            return Err(FrameError::Truncated);
        };
        let want = (u32::from_le_bytes(len_bytes) as usize)
            .max(FRAME_HEADER_LEN)
            .min(left);
        self.take_into(&mut joined, want - len_bytes.len());
        self.joined = Bytes::from(joined);
        check_frame_with(&self.joined, 0, self.verify_crc)
    }

    /// Appends the next `count` bytes from the cursor (there are as many left) to `out`,
    /// moving the cursor over piece boundaries.
    fn take_into(&mut self, out: &mut Vec<u8>, mut count: usize) {
        out.reserve(count);
        while count > 0 {
            let piece = &self.pieces[self.piece];
            let take = count.min(piece.len() - self.pos);
            out.extend_from_slice(&piece[self.pos..self.pos + take]);
            self.pos += take;
            count -= take;
            if self.pos == piece.len() && self.piece + 1 < self.pieces.len() {
                self.piece += 1;
                self.pos = 0;
            }
        }
    }
}

/// Where the first damaged frame of `buf` starts, and why it is: `buf` holds frames end to
/// end (a segment object, every byte of it a frame), each checked with its CRC. `None` when
/// every frame is whole.
pub fn first_damage(buf: &[u8]) -> Option<(usize, FrameError)> {
    let mut pos = 0;
    while pos < buf.len() {
        match check_frame(buf, pos) {
            Ok((_, len)) => pos += len,
            Err(error) => return Some((pos, error)),
        }
    }
    None
}

/// Length of the longest prefix of `buf` made of valid frames that ends with a whole request
/// (what recovery keeps of a torn version-1 WAL file, `wal_file.rs`: a request cut by a crash
/// was never acknowledged).
pub fn valid_prefix_len(buf: &[u8]) -> usize {
    let (mut pos, mut kept) = (0, 0);
    while let Ok((header, len)) = check_frame(buf, pos) {
        pos += len;
        if header.flags & FLAG_REQUEST_END != 0 {
            kept = pos;
        }
    }
    kept
}

/// Splits a headers block into `(name, value)` pairs. The block was written by
/// [`encode_frame`] and CRC-checked, so a malformed one is corruption: it yields what it can.
pub fn parse_headers(block: &Bytes) -> Vec<RecordHeader> {
    let mut out = Vec::new();
    if block.len() < 4 {
        return out;
    }
    let count = u32::from_le_bytes(block[..4].try_into().expect("4 bytes")) as usize;
    let mut pos = 4;
    let take = |pos: &mut usize| -> Option<Bytes> {
        let len = u32::from_le_bytes(block.get(*pos..*pos + 4)?.try_into().ok()?) as usize;
        let value = block.get(*pos + 4..*pos + 4 + len)?;
        let value = block.slice_ref(value);
        *pos += 4 + len;
        Some(value)
    };
    for _ in 0..count.min(block.len() / 8) {
        let (Some(name), Some(value)) = (take(&mut pos), take(&mut pos)) else {
            break;
        };
        out.push((name, value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header_strategy() -> impl Strategy<Value = Vec<RecordHeader>> {
        proptest::collection::vec(
            (any::<Vec<u8>>(), any::<Vec<u8>>())
                .prop_map(|(n, v)| (Bytes::from(n), Bytes::from(v))),
            0..4,
        )
    }

    proptest! {
        #[test]
        fn round_trip(id: u64, offset: u64, ts: i64, headers in header_strategy(), body: Vec<u8>, writer_seq in proptest::option::of("[a-z0-9]{0,40}")) {
            let mut buf = Vec::new();
            let producer = (id % 2 == 0).then(|| ProducerTuple { id: format!("p{offset}"), epoch: id, seq: offset });
            let meta = FrameMeta { kind: FRAME_KIND_RECORD, stream_id: id, offset, timestamp_ms: ts, request_end: true, producer: producer.as_ref(), writer_seq: writer_seq.as_deref() };
            encode_frame(&mut buf, meta, &headers, &body);
            prop_assert_eq!(buf.len(), frame_len(&headers, producer.as_ref(), writer_seq.as_deref(), body.len()));
            let buf = Bytes::from(buf);
            let (frame, len) = decode_frame(&buf, 0).unwrap();
            prop_assert_eq!(len, buf.len());
            prop_assert_eq!(frame.stream_id, id);
            prop_assert_eq!(frame.offset, offset);
            prop_assert_eq!(frame.timestamp_ms, ts);
            prop_assert_eq!(&frame.body[..], &body[..]);
            prop_assert_eq!(&frame.producer, &producer);
            prop_assert_eq!(&frame.writer_seq, &writer_seq);
            prop_assert!(frame.request_end());
            prop_assert_eq!(parse_headers(&frame.headers), headers);
        }

        #[test]
        fn truncation_or_corruption_is_detected(body in proptest::collection::vec(any::<u8>(), 1..200), cut in 0usize..240, flip in 8usize..240) {
            let mut buf = Vec::new();
            encode_frame(&mut buf, record(7, 3, 1, true), &[], &body);
            let full = buf.len();
            if cut < full {
                prop_assert!(check_frame(&buf[..cut], 0).is_err());
                prop_assert_eq!(valid_prefix_len(&buf[..cut]), 0);
            }
            let flip = flip % full;
            if flip >= 8 {
                buf[flip] ^= 0x5a;
                prop_assert!(check_frame(&buf, 0).is_err());
            }
        }
    }

    /// Frames of `bodies` end to end, one stream, each its own request.
    fn frames(bodies: &[Vec<u8>]) -> Vec<u8> {
        let mut buf = Vec::new();
        for (i, body) in bodies.iter().enumerate() {
            encode_frame(&mut buf, record(3, i as u64, 9, true), &[], body);
        }
        buf
    }

    /// `buf` cut at `cuts` (any order, repeats and 0 allowed: empty pieces are legal).
    fn split(buf: &[u8], cuts: &[usize]) -> Vec<Bytes> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (buf.len() + 1)).collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().chain([buf.len()]) {
            pieces.push(Bytes::copy_from_slice(&buf[from..cut]));
            from = cut;
        }
        pieces
    }

    /// What a scan over pieces finds: (offset, body) per frame, then the error if one ended it.
    fn scan(pieces: &[Bytes], verify_crc: bool) -> (Vec<(u64, Vec<u8>)>, Option<FrameError>) {
        let mut found = Vec::new();
        let mut frames = SplitFrames::new(pieces, verify_crc);
        while let Some(next) = frames.next_frame() {
            match next {
                Ok(f) => {
                    let frame = frame_at(f.buf, f.pos, &f.header, f.len);
                    found.push((frame.offset, frame.body.to_vec()));
                }
                Err(e) => return (found, Some(e)),
            }
        }
        (found, None)
    }

    proptest! {
        #[test]
        fn split_frames_match_one_buffer(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            verify_crc: bool,
        ) {
            let buf = frames(&bodies);
            let (found, error) = scan(&split(&buf, &cuts), verify_crc);
            prop_assert_eq!(error, None);
            let expected: Vec<(u64, Vec<u8>)> =
                bodies.iter().enumerate().map(|(i, b)| (i as u64, b.clone())).collect();
            prop_assert_eq!(found, expected);
        }

        #[test]
        fn split_frames_stop_at_damage(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..300), 1..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            flip: usize,
            cut_tail in 1usize..40,
        ) {
            let mut buf = frames(&bodies);
            // A flipped byte past a frame's lengths and flags fails that frame's CRC; what
            // precedes it is found, nothing after it.
            let flip = flip % buf.len();
            let mut starts = vec![0];
            for b in &bodies[..bodies.len() - 1] {
                starts.push(starts.last().unwrap() + FRAME_HEADER_LEN + b.len());
            }
            let hit = starts.iter().rposition(|s| *s <= flip).unwrap();
            if flip - starts[hit] >= 16 {
                buf[flip] ^= 0x41;
                let (found, error) = scan(&split(&buf, &cuts), true);
                prop_assert_eq!(found.len(), hit);
                prop_assert_eq!(error, Some(FrameError::BadChecksum));
                buf[flip] ^= 0x41;
            }
            // A torn tail: the whole frames before it, then Truncated.
            let torn = &buf[..buf.len() - cut_tail.min(buf.len() - starts[bodies.len() - 1]).max(1)];
            let (found, error) = scan(&split(torn, &cuts), true);
            prop_assert_eq!(found.len(), bodies.len() - 1);
            prop_assert_eq!(error, Some(FrameError::Truncated));
        }
    }

    #[test]
    fn split_frames_copy_only_frames_cut_by_a_boundary() {
        let bodies: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 100]).collect();
        let buf = frames(&bodies);
        let frame = FRAME_HEADER_LEN + 100;
        // Frame 1 is cut inside its header; frames 0, 2 and 3 lie whole in a piece.
        let pieces = split(&buf, &[frame + 10]);
        let mut frames = SplitFrames::new(&pieces, true);
        let mut in_place = Vec::new();
        while let Some(f) = frames.next_frame() {
            let f = f.unwrap();
            in_place.push(pieces.iter().any(|p| p.as_ptr() == f.buf.as_ptr()));
        }
        assert_eq!(in_place, [true, false, true, true]);
        // A zero length across a boundary is the end marker, as in one buffer.
        let mut ended = buf.clone();
        ended.extend_from_slice(&[0; 8]);
        let (found, error) = scan(&split(&ended, &[buf.len() + 2]), true);
        assert_eq!((found.len(), error), (4, Some(FrameError::End)));
    }

    fn record(
        stream_id: u64,
        offset: u64,
        timestamp_ms: i64,
        request_end: bool,
    ) -> FrameMeta<'static> {
        FrameMeta {
            writer_seq: None,
            kind: FRAME_KIND_RECORD,
            stream_id,
            offset,
            timestamp_ms,
            request_end,
            producer: None,
        }
    }

    #[test]
    fn recovery_keeps_whole_requests_only() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, record(1, 0, 5, true), &[], b"a");
        let first = buf.len();
        encode_frame(&mut buf, record(1, 1, 6, false), &[], b"b");
        encode_frame(&mut buf, record(1, 2, 6, false), &[], b"c");
        assert_eq!(
            valid_prefix_len(&buf),
            first,
            "a request without its end frame is dropped"
        );
        encode_frame(&mut buf, record(1, 3, 6, true), &[], b"d");
        assert_eq!(valid_prefix_len(&buf), buf.len());
    }

    #[test]
    fn zero_length_marks_the_end() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, record(1, 0, 5, true), &[], b"a");
        encode_frame(&mut buf, record(1, 1, 6, true), &[], b"b");
        let used = buf.len();
        buf.resize(used + 4096, 0);
        assert_eq!(valid_prefix_len(&buf), used);
        assert_eq!(check_frame(&buf, used).unwrap_err(), FrameError::End);
    }
}
