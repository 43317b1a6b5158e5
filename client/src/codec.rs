//! The Pico protocol's two binary formats (pico-protocol.md §2.9 and §2.11).
//!
//! Append body, `Content-Type: application/vnd.picomq.batch` (all integers big-endian):
//!
//! ```text
//! +---------+-----------+---------------------------------------------------------------+
//! | version | count     | count × record                                                |
//! | u8 = 1  | u32       |                                                               |
//! +---------+-----------+---------------------------------------------------------------+
//! record: | header count u32 | headers | body len u32 | body |
//! header: | name len u32 | name (UTF-8) | value len u32 | value (UTF-8) |
//! ```
//!
//! Read body, `GET ...?format=binary`: the same layout, except that every record starts with
//! its `u64` sequence and `i64` timestamp (ms) before the header count.
//!
//! Both directions of both formats live here: the client needs the encoder of one and the
//! decoder of the other; the opposite halves let tests (and mock servers) round-trip them.
//! Decoders never panic and never trust a length or count before the bytes are there.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

/// The only version of both formats.
pub const BATCH_VERSION: u8 = 1;

/// `Content-Type` of a binary append batch (also the type of a binary read response).
pub const BATCH_CONTENT_TYPE: &str = "application/vnd.picomq.batch";

/// Smallest encoded record of an append batch: header count + body length.
const MIN_BATCH_RECORD_LEN: usize = 4 + 4;
/// Smallest encoded record of a read response: seq + timestamp + header count + body length.
const MIN_READ_RECORD_LEN: usize = 8 + 8 + 4 + 4;

/// A record to append: headers (name, value) and a body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewRecord {
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl NewRecord {
    /// A record without headers.
    pub fn new(body: impl Into<Bytes>) -> NewRecord {
        NewRecord {
            headers: Vec::new(),
            body: body.into(),
        }
    }
}

impl From<Bytes> for NewRecord {
    fn from(body: Bytes) -> NewRecord {
        NewRecord::new(body)
    }
}

impl From<Vec<u8>> for NewRecord {
    fn from(body: Vec<u8>) -> NewRecord {
        NewRecord::new(body)
    }
}

impl From<String> for NewRecord {
    fn from(body: String) -> NewRecord {
        NewRecord::new(body)
    }
}

impl From<&str> for NewRecord {
    fn from(body: &str) -> NewRecord {
        NewRecord::new(Bytes::copy_from_slice(body.as_bytes()))
    }
}

impl From<&[u8]> for NewRecord {
    fn from(body: &[u8]) -> NewRecord {
        NewRecord::new(Bytes::copy_from_slice(body))
    }
}

/// A record as read back from a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Position in the stream (Pico sequence number).
    pub seq: u64,
    /// Server-assigned append time, epoch milliseconds.
    pub timestamp: i64,
    /// Record headers; the server returns them sorted by name.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// Why a buffer could not be encoded or decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodecError {
    /// The buffer ended inside the named field.
    Truncated(&'static str),
    UnknownVersion(u8),
    /// A header name or value is not UTF-8.
    InvalidUtf8,
    /// Bytes left over after the last record.
    TrailingBytes(usize),
    /// A length or count does not fit the format's `u32`.
    TooLarge(&'static str),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Truncated(field) => write!(f, "truncated batch: ends inside {field}"),
            CodecError::UnknownVersion(v) => write!(f, "unknown batch version {v}"),
            CodecError::InvalidUtf8 => f.write_str("invalid UTF-8 in record headers"),
            CodecError::TrailingBytes(n) => write!(f, "{n} trailing bytes after the last record"),
            CodecError::TooLarge(what) => write!(f, "{what} does not fit in 32 bits"),
        }
    }
}

impl std::error::Error for CodecError {}

/// Encodes an append batch of bodies without headers (the common case).
pub fn encode_binary_batch(bodies: &[Bytes]) -> Result<Bytes, CodecError> {
    let size = 1 + 4 + bodies.iter().map(|b| 8 + b.len()).sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    out.put_u8(BATCH_VERSION);
    out.put_u32(len_u32(bodies.len(), "record count")?);
    for body in bodies {
        out.put_u32(0);
        put_bytes(&mut out, body, "record body")?;
    }
    Ok(out.freeze())
}

/// Encodes an append batch of records with headers.
pub fn encode_binary_batch_records(records: &[NewRecord]) -> Result<Bytes, CodecError> {
    let mut out =
        BytesMut::with_capacity(1 + 4 + records.iter().map(batch_record_len).sum::<usize>());
    out.put_u8(BATCH_VERSION);
    out.put_u32(len_u32(records.len(), "record count")?);
    for record in records {
        put_headers(&mut out, &record.headers)?;
        put_bytes(&mut out, &record.body, "record body")?;
    }
    Ok(out.freeze())
}

/// Decodes an append batch (what a server does with the body). Strict: trailing bytes are an
/// error here, although the reference server ignores them.
pub fn decode_binary_batch(buf: &Bytes) -> Result<Vec<NewRecord>, CodecError> {
    let mut reader = Reader::new(buf);
    let count = reader.header()?;
    let mut records = Vec::with_capacity(reader.capacity_for(count, MIN_BATCH_RECORD_LEN));
    for _ in 0..count {
        let headers = reader.headers()?;
        let body = reader.sized_bytes("record body")?;
        records.push(NewRecord { headers, body });
    }
    reader.finish()?;
    Ok(records)
}

/// Encodes a `format=binary` read response (what a server sends).
pub fn encode_read_page(records: &[Record]) -> Result<Bytes, CodecError> {
    let size = 1
        + 4
        + records
            .iter()
            .map(|r| 16 + read_record_len(r))
            .sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    out.put_u8(BATCH_VERSION);
    out.put_u32(len_u32(records.len(), "record count")?);
    for record in records {
        out.put_u64(record.seq);
        out.put_i64(record.timestamp);
        put_headers(&mut out, &record.headers)?;
        put_bytes(&mut out, &record.body, "record body")?;
    }
    Ok(out.freeze())
}

/// Decodes a `format=binary` read response. Bodies are slices of `buf` (no copy).
pub fn decode_read_page(buf: &Bytes) -> Result<Vec<Record>, CodecError> {
    let mut reader = Reader::new(buf);
    let count = reader.header()?;
    let mut records = Vec::with_capacity(reader.capacity_for(count, MIN_READ_RECORD_LEN));
    for _ in 0..count {
        let seq = reader.u64("record sequence")?;
        let timestamp = reader.u64("record timestamp")? as i64;
        let headers = reader.headers()?;
        let body = reader.sized_bytes("record body")?;
        records.push(Record {
            seq,
            timestamp,
            headers,
            body,
        });
    }
    reader.finish()?;
    Ok(records)
}

fn batch_record_len(record: &NewRecord) -> usize {
    4 + headers_len(&record.headers) + 4 + record.body.len()
}

fn read_record_len(record: &Record) -> usize {
    4 + headers_len(&record.headers) + 4 + record.body.len()
}

fn headers_len(headers: &[(String, String)]) -> usize {
    headers.iter().map(|(n, v)| 8 + n.len() + v.len()).sum()
}

fn len_u32(len: usize, what: &'static str) -> Result<u32, CodecError> {
    u32::try_from(len).map_err(|_| CodecError::TooLarge(what))
}

fn put_bytes(out: &mut BytesMut, bytes: &[u8], what: &'static str) -> Result<(), CodecError> {
    out.put_u32(len_u32(bytes.len(), what)?);
    out.put_slice(bytes);
    Ok(())
}

fn put_headers(out: &mut BytesMut, headers: &[(String, String)]) -> Result<(), CodecError> {
    out.put_u32(len_u32(headers.len(), "header count")?);
    for (name, value) in headers {
        put_bytes(out, name.as_bytes(), "header name")?;
        put_bytes(out, value.as_bytes(), "header value")?;
    }
    Ok(())
}

/// A bounds-checked cursor: every read names the field it wanted, for the error message.
struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a Bytes) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], CodecError> {
        if self.remaining() < n {
            return Err(CodecError::Truncated(field));
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, CodecError> {
        Ok(self.take(1, field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, CodecError> {
        let bytes = self.take(4, field)?;
        Ok(u32::from_be_bytes(
            bytes.try_into().expect("took exactly 4 bytes"),
        ))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, CodecError> {
        let bytes = self.take(8, field)?;
        Ok(u64::from_be_bytes(
            bytes.try_into().expect("took exactly 8 bytes"),
        ))
    }

    /// Version byte and record count.
    fn header(&mut self) -> Result<u32, CodecError> {
        let version = self.u8("version")?;
        if version != BATCH_VERSION {
            return Err(CodecError::UnknownVersion(version));
        }
        self.u32("record count")
    }

    /// Preallocation for `count` records, bounded by what the buffer can hold, so a forged
    /// count cannot make us allocate gigabytes.
    fn capacity_for(&self, count: u32, min_record_len: usize) -> usize {
        (count as usize).min(self.remaining() / min_record_len)
    }

    fn sized_bytes(&mut self, field: &'static str) -> Result<Bytes, CodecError> {
        let len = self.u32(field)? as usize;
        if self.remaining() < len {
            return Err(CodecError::Truncated(field));
        }
        let bytes = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(bytes)
    }

    fn string(&mut self, field: &'static str) -> Result<String, CodecError> {
        let len = self.u32(field)? as usize;
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| CodecError::InvalidUtf8)
    }

    fn headers(&mut self) -> Result<Vec<(String, String)>, CodecError> {
        let count = self.u32("header count")?;
        let mut headers = Vec::with_capacity(self.capacity_for(count, 8));
        for _ in 0..count {
            let name = self.string("header name")?;
            let value = self.string("header value")?;
            headers.push((name, value));
        }
        Ok(headers)
    }

    fn finish(self) -> Result<(), CodecError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(CodecError::TrailingBytes(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_records() -> Vec<Record> {
        vec![
            Record {
                seq: 0,
                timestamp: 1_700_000_000_000,
                headers: vec![],
                body: Bytes::from_static(b"one"),
            },
            Record {
                seq: 1,
                timestamp: -5,
                headers: vec![("a".into(), "1".into()), ("k".into(), "v\u{e9}".into())],
                body: Bytes::from_static(&[0, 159, 255]),
            },
            Record {
                seq: u64::MAX,
                timestamp: i64::MAX,
                headers: vec![("".into(), "".into())],
                body: Bytes::new(),
            },
        ]
    }

    #[test]
    fn batch_of_bodies_has_the_documented_layout() {
        let encoded = encode_binary_batch(&[Bytes::from_static(b"hi"), Bytes::new()]).unwrap();
        let expected: &[u8] = &[
            1, // version
            0, 0, 0, 2, // count
            0, 0, 0, 0, // no headers
            0, 0, 0, 2, b'h', b'i', // body
            0, 0, 0, 0, // no headers
            0, 0, 0, 0, // empty body
        ];
        assert_eq!(&encoded[..], expected);
    }

    #[test]
    fn batch_with_headers_has_the_documented_layout() {
        let record = NewRecord {
            headers: vec![("k".into(), "vv".into())],
            body: Bytes::from_static(b"b"),
        };
        let encoded = encode_binary_batch_records(&[record]).unwrap();
        let expected: &[u8] = &[
            1, 0, 0, 0, 1, // version, count
            0, 0, 0, 1, // one header
            0, 0, 0, 1, b'k', 0, 0, 0, 2, b'v', b'v', // name, value
            0, 0, 0, 1, b'b', // body
        ];
        assert_eq!(&encoded[..], expected);
    }

    #[test]
    fn batch_round_trips() {
        let records: Vec<NewRecord> = sample_records()
            .into_iter()
            .map(|r| NewRecord {
                headers: r.headers,
                body: r.body,
            })
            .collect();
        let encoded = encode_binary_batch_records(&records).unwrap();
        assert_eq!(decode_binary_batch(&encoded).unwrap(), records);

        let bodies: Vec<Bytes> = records.iter().map(|r| r.body.clone()).collect();
        let decoded = decode_binary_batch(&encode_binary_batch(&bodies).unwrap()).unwrap();
        assert_eq!(
            decoded.into_iter().map(|r| r.body).collect::<Vec<_>>(),
            bodies
        );
    }

    #[test]
    fn read_page_round_trips() {
        let records = sample_records();
        let encoded = encode_read_page(&records).unwrap();
        assert_eq!(decode_read_page(&encoded).unwrap(), records);
        assert_eq!(
            decode_read_page(&encode_read_page(&[]).unwrap()).unwrap(),
            vec![]
        );
    }

    #[test]
    fn read_page_has_the_documented_layout() {
        let record = Record {
            seq: 7,
            timestamp: 9,
            headers: vec![],
            body: Bytes::from_static(b"x"),
        };
        let encoded = encode_read_page(&[record]).unwrap();
        let mut expected = vec![1, 0, 0, 0, 1];
        expected.extend_from_slice(&7u64.to_be_bytes());
        expected.extend_from_slice(&9i64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, b'x']);
        assert_eq!(&encoded[..], &expected[..]);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let page = encode_read_page(&sample_records()).unwrap();
        for len in 0..page.len() {
            let cut = page.slice(..len);
            assert!(
                matches!(decode_read_page(&cut), Err(CodecError::Truncated(_))),
                "read page cut at {len}"
            );
        }
        let records: Vec<NewRecord> = sample_records()
            .into_iter()
            .map(|r| NewRecord {
                headers: r.headers,
                body: r.body,
            })
            .collect();
        let batch = encode_binary_batch_records(&records).unwrap();
        for len in 0..batch.len() {
            let cut = batch.slice(..len);
            assert!(
                matches!(decode_binary_batch(&cut), Err(CodecError::Truncated(_))),
                "batch cut at {len}"
            );
        }
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        // Wrong version.
        let wrong = Bytes::from_static(&[2, 0, 0, 0, 0]);
        assert_eq!(decode_read_page(&wrong), Err(CodecError::UnknownVersion(2)));
        // A forged huge count with no records behind it.
        let forged = Bytes::from_static(&[1, 255, 255, 255, 255]);
        assert!(matches!(
            decode_read_page(&forged),
            Err(CodecError::Truncated(_))
        ));
        assert!(matches!(
            decode_binary_batch(&forged),
            Err(CodecError::Truncated(_))
        ));
        // A huge body length.
        let huge_body = Bytes::from_static(&[1, 0, 0, 0, 1, 0, 0, 0, 0, 255, 255, 255, 255, 1]);
        assert!(matches!(
            decode_binary_batch(&huge_body),
            Err(CodecError::Truncated(_))
        ));
        // Non-UTF-8 header name.
        let bad_utf8 = Bytes::from_static(&[
            1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0, 0, 0, 0, 0, 0, 0, 0,
        ]);
        assert_eq!(decode_binary_batch(&bad_utf8), Err(CodecError::InvalidUtf8));
        // Trailing garbage.
        let mut trailing = encode_binary_batch(&[Bytes::from_static(b"a")])
            .unwrap()
            .to_vec();
        trailing.push(0);
        assert_eq!(
            decode_binary_batch(&Bytes::from(trailing)),
            Err(CodecError::TrailingBytes(1))
        );
    }

    #[test]
    fn decoded_bodies_share_the_input_buffer() {
        let page = encode_read_page(&sample_records()).unwrap();
        let decoded = decode_read_page(&page).unwrap();
        let range = page.as_ptr_range();
        assert!(range.contains(&decoded[0].body.as_ptr()));
    }
}
