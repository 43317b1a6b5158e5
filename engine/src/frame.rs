//! Record frames: the one byte format of the WAL, of sealed segments and of what reads decode.
//!
//! ```text
//!  0       4       8     9     10      12      16              24              32              40
//!  +-------+-------+-----+-----+-------+-------+---------------+---------------+---------------+---------+------+
//!  | len   | crc   |kind |flags| rsvd  |hdr_len| stream_id     | offset        | timestamp_ms  | headers | body |
//!  | u32   | u32   | u8  | u8  | u16   | u32   | u64           | u64           | i64           | hdr_len |      |
//!  +-------+-------+-----+-----+-------+-------+---------------+---------------+---------------+---------+------+
//!  all integers little-endian
//!  len   = bytes of the whole frame (FRAME_HEADER_LEN + hdr_len + body length)
//!  crc   = CRC32C of bytes [8, len): a torn or corrupt frame fails it
//!  kind  = FRAME_KIND_RECORD (one record at `offset`) or FRAME_KIND_CLOSE (the stream closed
//!          at `offset` = its next offset; no headers, no body)
//!  headers block (record headers, may be empty):
//!  +-----------+-----------------------------------------------------------------+
//!  | count u32 | count × ( name_len u32 | name | value_len u32 | value )        |
//!  +-----------+-----------------------------------------------------------------+
//! ```
//!
//! A `len` of zero marks the end of a WAL file: files are pre-allocated with zeros and DMA
//! writes pad the last block with zeros.

use bytes::Bytes;
use zerocopy::byteorder::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of [`FrameHeader`] on disk.
pub const FRAME_HEADER_LEN: usize = 40;
/// Stable, persisted.
pub const FRAME_KIND_RECORD: u8 = 1;
/// Stable, persisted.
pub const FRAME_KIND_CLOSE: u8 = 2;

/// The fixed frame header, read and written in place (see the module diagram).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct FrameHeader {
    pub len: U32,
    pub crc: U32,
    pub kind: u8,
    pub flags: u8,
    pub reserved: U16,
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

/// Bytes a record frame takes.
pub fn record_frame_len(headers: &[RecordHeader], body_len: usize) -> usize {
    FRAME_HEADER_LEN + headers_block_len(headers) + body_len
}

/// Appends one frame to `out`. The only copy of the body on the write path.
pub fn encode_frame(
    out: &mut Vec<u8>,
    kind: u8,
    stream_id: u64,
    offset: u64,
    timestamp_ms: i64,
    headers: &[RecordHeader],
    body: &[u8],
) {
    let start = out.len();
    let headers_len = headers_block_len(headers);
    let len = FRAME_HEADER_LEN + headers_len + body.len();
    let header = FrameHeader {
        len: U32::new(len as u32),
        crc: U32::new(0),
        kind,
        flags: 0,
        reserved: U16::new(0),
        headers_len: U32::new(headers_len as u32),
        stream_id: U64::new(stream_id),
        offset: U64::new(offset),
        timestamp_ms: I64::new(timestamp_ms),
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
    pub stream_id: u64,
    pub offset: u64,
    pub timestamp_ms: i64,
    /// The raw headers block (see the module diagram); empty when the record has none.
    pub headers: Bytes,
    pub body: Bytes,
}

/// Reads the header at `pos` of `buf` and checks its length and CRC; returns it and the frame length.
pub fn check_frame(buf: &[u8], pos: usize) -> Result<(FrameHeader, usize), FrameError> {
    let rest = buf.get(pos..).ok_or(FrameError::Truncated)?;
    if rest.len() >= 4 && rest[..4] == [0, 0, 0, 0] {
        return Err(FrameError::End);
    }
    let (header, _) = FrameHeader::read_from_prefix(rest).map_err(|_| FrameError::Truncated)?;
    let len = header.len.get() as usize;
    if len < FRAME_HEADER_LEN || header.headers_len.get() as usize > len - FRAME_HEADER_LEN {
        return Err(FrameError::BadLength);
    }
    if rest.len() < len {
        return Err(FrameError::Truncated);
    }
    if crc32c::crc32c(&rest[8..len]) != header.crc.get() {
        return Err(FrameError::BadChecksum);
    }
    Ok((header, len))
}

/// Decodes the frame at `pos` of `buf` without copying its payload.
pub fn decode_frame(buf: &Bytes, pos: usize) -> Result<(Frame, usize), FrameError> {
    let (header, len) = check_frame(buf, pos)?;
    let headers_end = pos + FRAME_HEADER_LEN + header.headers_len.get() as usize;
    Ok((
        Frame {
            kind: header.kind,
            stream_id: header.stream_id.get(),
            offset: header.offset.get(),
            timestamp_ms: header.timestamp_ms.get(),
            headers: buf.slice(pos + FRAME_HEADER_LEN..headers_end),
            body: buf.slice(headers_end..pos + len),
        },
        len,
    ))
}

/// Length of the longest prefix of `buf` made of valid frames (recovery keeps exactly that).
pub fn valid_prefix_len(buf: &[u8]) -> usize {
    let mut pos = 0;
    while let Ok((_, len)) = check_frame(buf, pos) {
        pos += len;
    }
    pos
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
        fn round_trip(id: u64, offset: u64, ts: i64, headers in header_strategy(), body: Vec<u8>) {
            let mut buf = Vec::new();
            encode_frame(&mut buf, FRAME_KIND_RECORD, id, offset, ts, &headers, &body);
            prop_assert_eq!(buf.len(), record_frame_len(&headers, body.len()));
            let buf = Bytes::from(buf);
            let (frame, len) = decode_frame(&buf, 0).unwrap();
            prop_assert_eq!(len, buf.len());
            prop_assert_eq!(frame.stream_id, id);
            prop_assert_eq!(frame.offset, offset);
            prop_assert_eq!(frame.timestamp_ms, ts);
            prop_assert_eq!(&frame.body[..], &body[..]);
            prop_assert_eq!(parse_headers(&frame.headers), headers);
        }

        #[test]
        fn truncation_or_corruption_is_detected(body in proptest::collection::vec(any::<u8>(), 1..200), cut in 0usize..240, flip in 8usize..240) {
            let mut buf = Vec::new();
            encode_frame(&mut buf, FRAME_KIND_RECORD, 7, 3, 1, &[], &body);
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

    #[test]
    fn zero_length_marks_the_end() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, FRAME_KIND_RECORD, 1, 0, 5, &[], b"a");
        encode_frame(&mut buf, FRAME_KIND_RECORD, 1, 1, 6, &[], b"b");
        let used = buf.len();
        buf.resize(used + 4096, 0);
        assert_eq!(valid_prefix_len(&buf), used);
        assert_eq!(check_frame(&buf, used).unwrap_err(), FrameError::End);
    }
}
