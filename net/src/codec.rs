//! The Pico protocol's body formats: append batches in, read formats out.

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use pico_engine::frame::parse_headers;
use pico_engine::{RecordInput, RecordView};

pub const BINARY_BATCH_TYPE: &str = "application/vnd.picomq.batch";
pub const JSON_BATCH_TYPE: &str = "application/vnd.picomq.batch+json";
/// Stable: the only version of both binary formats.
pub const BINARY_VERSION: u8 = 1;

/// Decodes a binary append batch (all integers big-endian):
///
/// ```text
/// +---------+-----------+-------------------------------------------------------------------+
/// | ver u8  | count u32 | count × ( hdr_count u32 | hdr_count × (len u32, name, len u32, value) |
/// |  = 1    |           |           | body_len u32 | body )                                  |
/// +---------+-----------+-------------------------------------------------------------------+
/// ```
/// Bodies and header values are slices of `body` (no copy). Trailing bytes are ignored.
pub fn decode_binary_batch(body: &Bytes) -> Result<Vec<RecordInput>, String> {
    if body.is_empty() {
        return Err("truncated batch".into());
    }
    let mut pos = 0usize;
    let take = |pos: &mut usize, n: usize| -> Result<Bytes, String> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= body.len())
            .ok_or("truncated payload")?;
        let out = body.slice(*pos..end);
        *pos = end;
        Ok(out)
    };
    let u32_at = |pos: &mut usize| -> Result<usize, String> {
        let b = take(pos, 4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let version = take(&mut pos, 1)?[0];
    if version != BINARY_VERSION {
        return Err(format!("unknown batch version {version}"));
    }
    let count = u32_at(&mut pos)?;
    // Every record takes at least 8 bytes: a count beyond that is a lie, not an allocation.
    let mut records = Vec::with_capacity(count.min(body.len() / 8));
    for _ in 0..count {
        let header_count = u32_at(&mut pos)?;
        let mut headers = Vec::with_capacity(header_count.min(body.len() / 8));
        for _ in 0..header_count {
            let name_len = u32_at(&mut pos)?;
            let name = take(&mut pos, name_len)?;
            let value_len = u32_at(&mut pos)?;
            let value = take(&mut pos, value_len)?;
            if std::str::from_utf8(&name).is_err() || std::str::from_utf8(&value).is_err() {
                return Err("invalid UTF-8 in headers".into());
            }
            headers.push((name, value));
        }
        let body_len = u32_at(&mut pos)?;
        let record_body = take(&mut pos, body_len)?;
        records.push(RecordInput {
            headers: sort_headers(headers),
            body: record_body,
        });
    }
    Ok(records)
}

/// Record headers are a map: duplicate names collapse (last wins), sorted by name.
fn sort_headers(headers: Vec<(Bytes, Bytes)>) -> Vec<(Bytes, Bytes)> {
    if headers.len() < 2 {
        return headers;
    }
    let map: std::collections::BTreeMap<Bytes, Bytes> = headers.into_iter().collect();
    map.into_iter().collect()
}

/// Decodes a JSON append batch: `{"records":[{"headers":{..},"body":"..."|"body_b64":".."}]}`.
pub fn decode_json_batch(body: &[u8]) -> Result<Vec<RecordInput>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| "invalid JSON".to_string())?;
    let records = value
        .get("records")
        .and_then(|r| r.as_array())
        .filter(|r| !r.is_empty())
        .ok_or("records must be a non-empty array")?;
    records
        .iter()
        .map(|record| {
            let mut headers = Vec::new();
            if let Some(map) = record.get("headers").and_then(|h| h.as_object()) {
                for (name, value) in map {
                    let text = match value {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    headers.push((Bytes::from(name.clone()), Bytes::from(text)));
                }
            }
            let body = if let Some(b64) = record.get("body_b64").and_then(|b| b.as_str()) {
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|_| "invalid body_b64".to_string())?
                    .into()
            } else if let Some(text) = record.get("body").and_then(|b| b.as_str()) {
                Bytes::from(text.to_string())
            } else {
                Bytes::new()
            };
            Ok(RecordInput {
                headers: sort_headers(headers),
                body,
            })
        })
        .collect()
}

/// The `json` read format: `[{"seq":..,"timestamp":..,"headers"?:{..},"body"|"body_b64":..}]`.
pub fn encode_json(records: &[RecordView]) -> Bytes {
    let mut out = Vec::with_capacity(records.iter().map(|r| r.body.len() + 48).sum::<usize>() + 2);
    out.push(b'[');
    for (i, record) in records.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(
            format!(
                "{{\"seq\":{},\"timestamp\":{}",
                record.offset, record.timestamp_ms
            )
            .as_bytes(),
        );
        let headers = parse_headers(&record.headers);
        if !headers.is_empty() {
            out.extend_from_slice(b",\"headers\":{");
            for (j, (name, value)) in headers.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                json_string(&mut out, &String::from_utf8_lossy(name));
                out.push(b':');
                json_string(&mut out, &String::from_utf8_lossy(value));
            }
            out.push(b'}');
        }
        match std::str::from_utf8(&record.body) {
            Ok(text) => {
                out.extend_from_slice(b",\"body\":");
                json_string(&mut out, text);
            }
            Err(_) => {
                out.extend_from_slice(b",\"body_b64\":\"");
                out.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(&record.body)
                        .as_bytes(),
                );
                out.push(b'"');
            }
        }
        out.push(b'}');
    }
    out.push(b']');
    out.into()
}

/// Appends `text` as a JSON string literal.
pub fn json_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(
        serde_json::to_string(text)
            .expect("strings always serialize")
            .as_bytes(),
    );
}

/// The `binary` read format (all integers big-endian):
///
/// ```text
/// +--------+-----------+---------------------------------------------------------------------------+
/// | ver u8 | count u32 | count × ( seq u64 | timestamp i64 | hdr_count u32 | headers (as in the     |
/// |  = 1   |           |           append batch) | body_len u32 | body )                             |
/// +--------+-----------+---------------------------------------------------------------------------+
/// ```
pub fn encode_binary(records: &[RecordView]) -> Bytes {
    let size = 5 + records
        .iter()
        .map(|r| 24 + r.headers.len() + r.body.len())
        .sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    out.put_u8(BINARY_VERSION);
    out.put_u32(records.len() as u32);
    for record in records {
        out.put_u64(record.offset);
        out.put_i64(record.timestamp_ms);
        let headers = parse_headers(&record.headers);
        out.put_u32(headers.len() as u32);
        for (name, value) in headers {
            out.put_u32(name.len() as u32);
            out.put_slice(&name);
            out.put_u32(value.len() as u32);
            out.put_slice(&value);
        }
        out.put_u32(record.body.len() as u32);
        out.put_slice(&record.body);
    }
    out.freeze()
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

    type TestRecord = (Vec<(String, String)>, Vec<u8>);

    fn encode_batch(records: &[TestRecord]) -> Vec<u8> {
        let mut out = vec![BINARY_VERSION];
        out.extend_from_slice(&(records.len() as u32).to_be_bytes());
        for (headers, body) in records {
            out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
            for (n, v) in headers {
                out.extend_from_slice(&(n.len() as u32).to_be_bytes());
                out.extend_from_slice(n.as_bytes());
                out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                out.extend_from_slice(v.as_bytes());
            }
            out.extend_from_slice(&(body.len() as u32).to_be_bytes());
            out.extend_from_slice(body);
        }
        out
    }

    fn records() -> impl Strategy<Value = Vec<TestRecord>> {
        proptest::collection::vec(
            (
                proptest::collection::btree_map("[a-z]{1,6}", ".{0,6}", 0..3)
                    .prop_map(|m| m.into_iter().collect::<Vec<_>>()),
                proptest::collection::vec(any::<u8>(), 0..40),
            ),
            1..6,
        )
    }

    proptest! {
        #[test]
        fn binary_batch_round_trip(input in records()) {
            let decoded = decode_binary_batch(&Bytes::from(encode_batch(&input))).unwrap();
            prop_assert_eq!(decoded.len(), input.len());
            for (got, (headers, body)) in decoded.iter().zip(&input) {
                prop_assert_eq!(&got.body[..], &body[..]);
                let names: Vec<_> = got.headers.iter().map(|(n, v)| (String::from_utf8(n.to_vec()).unwrap(), String::from_utf8(v.to_vec()).unwrap())).collect();
                prop_assert_eq!(&names, headers);
            }
        }

        #[test]
        fn truncated_binary_batch_is_an_error(input in records(), cut in 0usize..400) {
            let bytes = encode_batch(&input);
            if cut < bytes.len() {
                prop_assert!(decode_binary_batch(&Bytes::copy_from_slice(&bytes[..cut])).is_err());
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_binary_batch(&Bytes::from(bytes.clone()));
            let _ = decode_json_batch(&bytes);
        }
    }

    #[test]
    fn json_batch_forms() {
        let body = br#"{"records":[{"headers":{"k":"v","n":1},"body":"three"},{"body_b64":"AAECgP8="},{}]}"#;
        let records = decode_json_batch(body).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(&records[0].body[..], b"three");
        assert_eq!(records[0].headers[1], (Bytes::from("n"), Bytes::from("1")));
        assert_eq!(&records[1].body[..], &[0, 1, 2, 0x80, 0xff]);
        assert!(records[2].body.is_empty());
        assert_eq!(decode_json_batch(b"{").unwrap_err(), "invalid JSON");
        assert_eq!(
            decode_json_batch(br#"{"records":[]}"#).unwrap_err(),
            "records must be a non-empty array"
        );
        assert_eq!(
            decode_json_batch(br#"{"records":[{"body_b64":"!"}]}"#).unwrap_err(),
            "invalid body_b64"
        );
    }

    #[test]
    fn version_and_truncation_messages() {
        assert_eq!(
            decode_binary_batch(&Bytes::from_static(&[2, 0, 0, 0, 0])).unwrap_err(),
            "unknown batch version 2"
        );
        assert_eq!(
            decode_binary_batch(&Bytes::new()).unwrap_err(),
            "truncated batch"
        );
        assert_eq!(
            decode_binary_batch(&Bytes::from_static(&[1, 0, 0, 0, 1])).unwrap_err(),
            "truncated payload"
        );
    }
}
