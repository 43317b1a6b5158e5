//! The Pico protocol's two binary formats, for the client: the append batch it sends and the
//! read page it receives (`pico_proto::batch`, `pico_proto::page`, where the layouts are
//! drawn). Both directions of both are here so that tests and mock servers can round-trip.

use std::fmt;

use bytes::Bytes;
use pico_proto::batch::BatchWriter;
use pico_proto::page::PageWriter;
use pico_proto::{DecodeError, TooLarge};

/// The only version of both formats.
pub const BATCH_VERSION: u8 = pico_proto::batch::VERSION;

/// `Content-Type` of a binary append batch (also the type of a binary read response).
pub const BATCH_CONTENT_TYPE: &str = pico_proto::media::BATCH;

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
    /// A length or count does not fit the format's `u32`.
    TooLarge(&'static str),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Truncated(field) => write!(f, "truncated batch: ends inside {field}"),
            CodecError::UnknownVersion(v) => write!(f, "unknown batch version {v}"),
            CodecError::InvalidUtf8 => f.write_str("invalid UTF-8 in record headers"),
            CodecError::TooLarge(what) => write!(f, "{what} does not fit in 32 bits"),
        }
    }
}

impl std::error::Error for CodecError {}

impl From<DecodeError> for CodecError {
    fn from(e: DecodeError) -> CodecError {
        match e {
            DecodeError::Empty => CodecError::Truncated("version"),
            DecodeError::UnknownVersion(v) => CodecError::UnknownVersion(v),
            DecodeError::Truncated(field) => CodecError::Truncated(field),
            DecodeError::InvalidUtf8 => CodecError::InvalidUtf8,
            // The client decodes without a record limit.
            DecodeError::TooManyRecords { .. } => CodecError::TooLarge("record count"),
        }
    }
}

impl From<TooLarge> for CodecError {
    fn from(TooLarge(what): TooLarge) -> CodecError {
        CodecError::TooLarge(what)
    }
}

/// Encodes an append batch of bodies without headers (the common case).
pub fn encode_binary_batch(bodies: &[Bytes]) -> Result<Bytes, CodecError> {
    Ok(pico_proto::batch::encode_bodies(bodies)?)
}

/// Encodes an append batch of records with headers.
pub fn encode_binary_batch_records(records: &[NewRecord]) -> Result<Bytes, CodecError> {
    let size = records
        .iter()
        .map(|r| BatchWriter::record_len(&r.headers, &r.body))
        .sum();
    let mut batch = BatchWriter::with_capacity(size);
    for record in records {
        batch.record(&record.headers, &record.body)?;
    }
    Ok(batch.finish())
}

/// Decodes an append batch (what a server does with the body). Bytes after the last record
/// are ignored, as the server ignores them.
pub fn decode_binary_batch(buf: &Bytes) -> Result<Vec<NewRecord>, CodecError> {
    Ok(pico_proto::batch::decode(buf, usize::MAX)?
        .into_iter()
        .map(|r| NewRecord {
            headers: text_headers(r.headers),
            body: r.body,
        })
        .collect())
}

/// Encodes a `format=binary` read response (what a server sends).
pub fn encode_read_page(records: &[Record]) -> Result<Bytes, CodecError> {
    let size = records
        .iter()
        .map(|r| PageWriter::record_len(&r.headers, &r.body))
        .sum();
    let mut page = PageWriter::with_capacity(size);
    for r in records {
        page.record(r.seq, r.timestamp, &r.headers, &r.body)?;
    }
    Ok(page.finish())
}

/// Decodes a `format=binary` read response. Bodies are slices of `buf` (no copy).
pub fn decode_read_page(buf: &Bytes) -> Result<Vec<Record>, CodecError> {
    Ok(pico_proto::page::decode(buf)?
        .into_iter()
        .map(|r| Record {
            seq: r.seq,
            timestamp: r.timestamp_ms,
            headers: text_headers(r.headers),
            body: r.body,
        })
        .collect())
}

/// Headers the decoder checked are UTF-8, as strings.
fn text_headers(headers: Vec<(Bytes, Bytes)>) -> Vec<(String, String)> {
    let text = |b: Bytes| String::from_utf8_lossy(&b).into_owned();
    headers
        .into_iter()
        .map(|(n, v)| (text(n), text(v)))
        .collect()
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
        // Bytes after the last record: ignored, as by the server.
        let mut trailing = encode_binary_batch(&[Bytes::from_static(b"a")])
            .unwrap()
            .to_vec();
        trailing.push(0);
        assert_eq!(
            decode_binary_batch(&Bytes::from(trailing)).unwrap().len(),
            1
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
