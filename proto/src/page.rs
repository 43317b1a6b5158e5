//! The Pico binary read page, the body of `GET ...?format=binary` (`docs/api.md`, "Reading").
//! The batch layout with every record's sequence and timestamp in front (big-endian):
//!
//! ```text
//! +---------+-----------+------------------------------------------------------------+
//! | version | count     | count × record                                             |
//! | u8 = 1  | u32       |                                                            |
//! +---------+-----------+------------------------------------------------------------+
//! record: | seq u64 | timestamp i64 (ms) | header count u32 | headers | body len u32 | body |
//! header: | name len u32 | name (UTF-8) | value len u32 | value (UTF-8) |
//! ```

use bytes::{BufMut, Bytes};

use crate::reader::{headers_len, put_headers, put_sized, Reader, Writer};
use crate::{DecodeError, TooLarge};

/// Smallest encoded record: seq + timestamp + header count + body length.
const MIN_RECORD_BYTES: usize = 8 + 8 + 4 + 4;

/// One record of a page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageRecord {
    /// Position in the stream (the Pico sequence number).
    pub seq: u64,
    /// Server-assigned append time, epoch milliseconds.
    pub timestamp_ms: i64,
    /// Sorted by name (record headers are a map).
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
}

/// The records of a page, decoded one at a time (no allocation but each record's headers).
pub struct PageRecords<'a> {
    reader: Reader<'a>,
    left: usize,
}

impl PageRecords<'_> {
    /// Records the page announces and that are not yet read.
    pub fn left(&self) -> usize {
        self.left
    }
}

impl Iterator for PageRecords<'_> {
    type Item = Result<PageRecord, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let record = (|| {
            let seq = self.reader.u64("record sequence")?;
            let timestamp_ms = self.reader.u64("record timestamp")? as i64;
            let headers = self.reader.headers()?;
            let body = self.reader.sized("record body")?;
            Ok(PageRecord {
                seq,
                timestamp_ms,
                headers,
                body,
            })
        })();
        if record.is_err() {
            // Nothing after a broken record can be trusted.
            self.left = 0;
        }
        Some(record)
    }
}

/// Walks a page record by record. Bodies are slices of `buf`.
pub fn records(buf: &Bytes) -> Result<PageRecords<'_>, DecodeError> {
    let (reader, left) = Reader::open(buf)?;
    Ok(PageRecords { reader, left })
}

/// Decodes a whole page.
pub fn decode(buf: &Bytes) -> Result<Vec<PageRecord>, DecodeError> {
    let records = records(buf)?;
    let mut out = Vec::with_capacity(records.reader.capacity_for(records.left, MIN_RECORD_BYTES));
    for record in records {
        out.push(record?);
    }
    Ok(out)
}

/// Builds a page record by record (what a server does with the records a read found).
pub struct PageWriter(Writer);

impl PageWriter {
    /// `bytes`: the expected size of the records' headers and bodies, to allocate once.
    pub fn with_capacity(bytes: usize) -> PageWriter {
        PageWriter(Writer::with_capacity(bytes))
    }

    /// The size a record adds to a page beyond its headers' and body's bytes.
    pub const RECORD_OVERHEAD_BYTES: usize = MIN_RECORD_BYTES;

    /// The bytes [`PageWriter::record`] adds for this record, to size the writer.
    pub fn record_len<N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &[(N, V)], body: &[u8]) -> usize {
        MIN_RECORD_BYTES + headers_len(headers) + body.len()
    }

    /// Adds a record. After an error the writer must be dropped.
    pub fn record<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        seq: u64,
        timestamp_ms: i64,
        headers: &[(N, V)],
        body: &[u8],
    ) -> Result<(), TooLarge> {
        let out = self.0.start_record()?;
        out.put_u64(seq);
        out.put_i64(timestamp_ms);
        put_headers(out, headers)?;
        put_sized(out, body, "record body")
    }

    pub fn finish(self) -> Bytes {
        self.0.finish()
    }
}

/// Encodes records (tests and mock servers; a server streams them through [`PageWriter`]).
pub fn encode(records: &[PageRecord]) -> Result<Bytes, TooLarge> {
    let size = records
        .iter()
        .map(|r| PageWriter::record_len(&r.headers, &r.body))
        .sum();
    let mut writer = PageWriter::with_capacity(size);
    for r in records {
        writer.record(r.seq, r.timestamp_ms, &r.headers, &r.body)?;
    }
    Ok(writer.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<PageRecord> {
        vec![
            PageRecord {
                seq: 0,
                timestamp_ms: 1_700_000_000_000,
                headers: vec![],
                body: Bytes::from_static(b"one"),
            },
            PageRecord {
                seq: 1,
                timestamp_ms: -5,
                headers: vec![
                    (Bytes::from("a"), Bytes::from("1")),
                    (Bytes::from("k"), Bytes::from("v\u{e9}")),
                ],
                body: Bytes::from_static(&[0, 159, 255]),
            },
            PageRecord {
                seq: u64::MAX,
                timestamp_ms: i64::MAX,
                headers: vec![(Bytes::new(), Bytes::new())],
                body: Bytes::new(),
            },
        ]
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let page = encode(&[PageRecord {
            seq: 7,
            timestamp_ms: 9,
            headers: vec![],
            body: Bytes::from_static(b"x"),
        }])
        .unwrap();
        let mut expected = vec![1, 0, 0, 0, 1];
        expected.extend_from_slice(&7u64.to_be_bytes());
        expected.extend_from_slice(&9i64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, b'x']);
        assert_eq!(&page[..], &expected[..]);
    }

    #[test]
    fn pages_round_trip_and_every_cut_is_an_error() {
        let page = encode(&sample()).unwrap();
        assert_eq!(decode(&page).unwrap(), sample());
        assert_eq!(decode(&encode(&[]).unwrap()).unwrap(), vec![]);
        for len in 0..page.len() {
            let err = decode(&page.slice(..len)).unwrap_err();
            assert!(
                matches!(err, DecodeError::Truncated(_) | DecodeError::Empty),
                "cut at {len}: {err:?}"
            );
        }
    }

    #[test]
    fn the_walker_stops_after_a_broken_record() {
        let page = encode(&sample()).unwrap();
        let cut = page.slice(..page.len() - 1);
        let results: Vec<_> = records(&cut).unwrap().collect();
        assert_eq!(results.len(), 3);
        assert!(results[..2].iter().all(Result::is_ok));
        assert!(results[2].is_err());
    }
}
