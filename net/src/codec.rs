//! The Pico protocol's bodies: the wire formats of `pico_proto`, turned into the engine's
//! records on the way in and built from them on the way out.

use bytes::{BufMut, Bytes, BytesMut};
use pico_engine::frame::parse_headers;
use pico_engine::{RecordInput, RecordView};
use pico_proto::json::JsonPageWriter;
use pico_proto::page::PageWriter;

pub use pico_proto::media::{BATCH as BINARY_BATCH_TYPE, BATCH_JSON as JSON_BATCH_TYPE};

/// Why an append batch was refused (`400`; its message is the answer's).
#[derive(Debug)]
pub enum BatchError {
    Binary(pico_proto::DecodeError),
    /// The JSON batch decoder's message.
    Json(String),
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchError::Binary(e) => e.fmt(f),
            BatchError::Json(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for BatchError {}

/// Decodes a binary append batch ([`pico_proto::batch`]).
pub fn decode_binary_batch(
    body: &Bytes,
    max_records: usize,
) -> Result<Vec<RecordInput>, BatchError> {
    pico_proto::batch::decode(body, max_records)
        .map(into_engine)
        .map_err(BatchError::Binary)
}

/// Decodes a JSON append batch ([`pico_proto::json`]).
pub fn decode_json_batch(body: &Bytes, max_records: usize) -> Result<Vec<RecordInput>, BatchError> {
    pico_proto::json::decode_batch(body, max_records)
        .map(into_engine)
        .map_err(BatchError::Json)
}

/// Record headers are a map: duplicate names collapse (last wins), sorted by name.
fn into_engine(records: Vec<pico_proto::Record>) -> Vec<RecordInput> {
    records
        .into_iter()
        .map(|record| RecordInput {
            headers: sort_headers(record.headers),
            body: record.body,
        })
        .collect()
}

fn sort_headers(headers: Vec<(Bytes, Bytes)>) -> Vec<(Bytes, Bytes)> {
    if headers.len() < 2 {
        return headers;
    }
    let map: std::collections::BTreeMap<Bytes, Bytes> = headers.into_iter().collect();
    map.into_iter().collect()
}

/// The `json` read format.
pub fn encode_json(records: &[RecordView]) -> Bytes {
    let bytes = records
        .iter()
        .map(|r| r.body.len() + JsonPageWriter::RECORD_OVERHEAD_BYTES)
        .sum();
    let mut page = JsonPageWriter::with_capacity(bytes);
    for record in records {
        let headers = parse_headers(&record.headers);
        page.record(record.offset, record.timestamp_ms, &headers, &record.body);
    }
    page.finish()
}

/// The `binary` read format ([`pico_proto::page`]).
pub fn encode_binary(records: &[RecordView]) -> Bytes {
    let bytes = records
        .iter()
        .map(|r| PageWriter::RECORD_OVERHEAD_BYTES + r.headers.len() + r.body.len())
        .sum();
    let mut page = PageWriter::with_capacity(bytes);
    for record in records {
        let headers = parse_headers(&record.headers);
        page.record(record.offset, record.timestamp_ms, &headers, &record.body)
            // A stored record came in one request body, which `--max-body-size` keeps below
            // 4 GiB; a read holds at most RECORDS_PER_READ_MAX records.
            .expect("a stored record fits the page format");
    }
    page.finish()
}

/// The `raw` read format: bodies back to back.
pub fn encode_raw(records: &[RecordView]) -> Bytes {
    if records.len() == 1 {
        return records[0].body.clone();
    }
    let mut out = BytesMut::with_capacity(records.iter().map(|r| r.body.len()).sum());
    for record in records {
        out.put_slice(&record.body);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_binary_batch(body in crate::fuzzing::inputs("binary_batch")) {
            if let Ok(records) = decode_binary_batch(&Bytes::from(body), 16) {
                prop_assert!(records.len() <= 16);
            }
        }

        #[test]
        fn fuzz_json_batch(body in crate::fuzzing::inputs("json_batch")) {
            if let Ok(records) = decode_json_batch(&Bytes::from(body), 16) {
                prop_assert!(!records.is_empty() && records.len() <= 16);
            }
        }
    }

    #[test]
    fn duplicate_binary_headers_keep_the_last_value_sorted_by_name() {
        let batch =
            pico_proto::batch::encode(&[(vec![("z", "1"), ("a", "2"), ("z", "3")], &b""[..])])
                .unwrap();
        let records = decode_binary_batch(&batch, 1).unwrap();
        let headers: Vec<(&[u8], &[u8])> = records[0]
            .headers
            .iter()
            .map(|(n, v)| (&n[..], &v[..]))
            .collect();
        assert_eq!(headers, [(&b"a"[..], &b"2"[..]), (b"z", b"3")]);
    }
}
