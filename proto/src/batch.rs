//! The Pico binary append batch, `Content-Type: application/vnd.picomq.batch` (`docs/api.md`,
//! "Appending"). All integers big-endian:
//!
//! ```text
//! +---------+-----------+------------------------------------------------------------+
//! | version | count     | count × record                                             |
//! | u8 = 1  | u32       |                                                            |
//! +---------+-----------+------------------------------------------------------------+
//! record: | header count u32 | header count × header | body len u32 | body |
//! header: | name len u32 | name (UTF-8) | value len u32 | value (UTF-8) |
//! ```
//!
//! Bytes after the last record are ignored (see the crate's documentation for why).

use bytes::{BufMut, Bytes};

use crate::reader::{headers_len, put_headers, put_sized, Reader, Writer};
use crate::{DecodeError, TooLarge};

pub use crate::reader::VERSION;

/// Smallest encoded record: header count + body length.
const MIN_RECORD_BYTES: usize = 4 + 4;

/// One record of a batch: headers (UTF-8 names and values, in the order sent) and a body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
}

/// Decodes a batch. Bodies and header values are slices of `buf` (no copy). A count above
/// `max_records` is refused before anything is decoded.
pub fn decode(buf: &Bytes, max_records: usize) -> Result<Vec<Record>, DecodeError> {
    let (mut reader, count) = Reader::open(buf)?;
    if count > max_records {
        return Err(DecodeError::TooManyRecords { max: max_records });
    }
    let mut records = Vec::with_capacity(reader.capacity_for(count, MIN_RECORD_BYTES));
    for _ in 0..count {
        let headers = reader.headers()?;
        let body = reader.sized("record body")?;
        records.push(Record { headers, body });
    }
    Ok(records)
}

/// Builds a batch record by record.
pub struct BatchWriter(Writer);

impl BatchWriter {
    /// `bytes`: the expected size of the records, to allocate once.
    pub fn with_capacity(bytes: usize) -> BatchWriter {
        BatchWriter(Writer::with_capacity(bytes))
    }

    /// The bytes [`BatchWriter::record`] adds for this record, to size the writer.
    pub fn record_len<N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &[(N, V)], body: &[u8]) -> usize {
        MIN_RECORD_BYTES + headers_len(headers) + body.len()
    }

    /// Adds a record. After an error the writer must be dropped.
    pub fn record<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        headers: &[(N, V)],
        body: &[u8],
    ) -> Result<(), TooLarge> {
        let out = self.0.start_record()?;
        put_headers(out, headers)?;
        put_sized(out, body, "record body")
    }

    /// Adds `count` records of `size` zero bytes without headers (load generators).
    pub fn zeroed_records(&mut self, count: usize, size: usize) -> Result<(), TooLarge> {
        let len = crate::reader::len_u32(size, "record body")?;
        for _ in 0..count {
            let out = self.0.start_record()?;
            out.put_u32(0);
            out.put_u32(len);
            out.put_bytes(0, size);
        }
        Ok(())
    }

    pub fn finish(self) -> Bytes {
        self.0.finish()
    }
}

/// Encodes records with headers.
pub fn encode<N: AsRef<[u8]>, V: AsRef<[u8]>, B: AsRef<[u8]>>(
    records: &[(Vec<(N, V)>, B)],
) -> Result<Bytes, TooLarge> {
    let size = records
        .iter()
        .map(|(headers, body)| BatchWriter::record_len(headers, body.as_ref()))
        .sum();
    let mut writer = BatchWriter::with_capacity(size);
    for (headers, body) in records {
        writer.record(headers, body.as_ref())?;
    }
    Ok(writer.finish())
}

/// Encodes records without headers (the common case).
pub fn encode_bodies<B: AsRef<[u8]>>(bodies: &[B]) -> Result<Bytes, TooLarge> {
    let size = bodies
        .iter()
        .map(|b| MIN_RECORD_BYTES + b.as_ref().len())
        .sum();
    let mut writer = BatchWriter::with_capacity(size);
    for body in bodies {
        writer.record::<&[u8], &[u8]>(&[], body.as_ref())?;
    }
    Ok(writer.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 100_000;

    #[test]
    fn the_layout_is_the_documented_one() {
        let encoded = encode_bodies(&[&b"hi"[..], b""]).unwrap();
        let expected: &[u8] = &[
            1, // version
            0, 0, 0, 2, // count
            0, 0, 0, 0, // no headers
            0, 0, 0, 2, b'h', b'i', // body
            0, 0, 0, 0, // no headers
            0, 0, 0, 0, // empty body
        ];
        assert_eq!(&encoded[..], expected);
        let with_header = encode(&[(vec![("k", "vv")], &b"b"[..])]).unwrap();
        let expected: &[u8] = &[
            1, 0, 0, 0, 1, // version, count
            0, 0, 0, 1, // one header
            0, 0, 0, 1, b'k', 0, 0, 0, 2, b'v', b'v', // name, value
            0, 0, 0, 1, b'b', // body
        ];
        assert_eq!(&with_header[..], expected);
        let mut zeroed = BatchWriter::with_capacity(0);
        zeroed.zeroed_records(2, 3).unwrap();
        let zeroed = zeroed.finish();
        assert_eq!(
            &zeroed[..],
            &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]
        );
    }

    #[test]
    fn errors_carry_the_protocols_messages() {
        let cases: [(&[u8], &str); 5] = [
            (&[], "truncated batch"),
            (&[2, 0, 0, 0, 0], "unknown batch version 2"),
            (&[1, 0, 0, 0, 1], "truncated payload"),
            (&[1, 0, 0, 0, 11], "at most 10 records per append"),
            (
                &[
                    1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0, 0, 0, 0, 0, 0, 0, 0,
                ],
                "invalid UTF-8 in headers",
            ),
        ];
        for (input, message) in cases {
            let err = decode(&Bytes::copy_from_slice(input), 10).unwrap_err();
            assert_eq!(err.to_string(), message, "{input:?}");
        }
    }

    #[test]
    fn a_forged_count_or_length_is_refused_without_allocating_it() {
        let forged = Bytes::from_static(&[1, 255, 255, 255, 255]);
        assert!(matches!(
            decode(&forged, usize::MAX),
            Err(DecodeError::Truncated(_))
        ));
        let huge_body = Bytes::from_static(&[1, 0, 0, 0, 1, 0, 0, 0, 0, 255, 255, 255, 255, 1]);
        assert_eq!(
            decode(&huge_body, LIMIT),
            Err(DecodeError::Truncated("record body"))
        );
    }

    #[test]
    fn bytes_after_the_last_record_are_ignored() {
        let mut trailing = encode_bodies(&[&b"a"[..]]).unwrap().to_vec();
        trailing.extend_from_slice(b"\0more");
        let records = decode(&Bytes::from(trailing), LIMIT).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(&records[0].body[..], b"a");
    }

    #[test]
    fn decoded_bodies_are_slices_of_the_input() {
        let batch = encode_bodies(&[&b"body"[..]]).unwrap();
        let records = decode(&batch, LIMIT).unwrap();
        assert!(batch.as_ptr_range().contains(&records[0].body.as_ptr()));
    }
}
