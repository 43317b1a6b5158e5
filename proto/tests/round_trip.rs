//! The whole format, encoded by one side and decoded by the other: what a client writes a
//! server reads back unchanged, and what a server sends a client reads back unchanged.

use bytes::Bytes;
use pico_proto::{batch, json, page, PageRecord};
use proptest::prelude::*;

type Headers = Vec<(String, String)>;

fn headers() -> impl Strategy<Value = Headers> {
    proptest::collection::vec((".{0,6}", ".{0,8}"), 0..4)
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        ".{0,32}".prop_map(String::into_bytes),
    ]
}

fn as_text(headers: &[(Bytes, Bytes)]) -> Headers {
    headers
        .iter()
        .map(|(n, v)| {
            let text = |b: &Bytes| String::from_utf8(b.to_vec()).expect("decoders check UTF-8");
            (text(n), text(v))
        })
        .collect()
}

proptest! {
    #[test]
    fn a_batch_decodes_to_what_was_encoded(records in proptest::collection::vec((headers(), body()), 0..8), trailing in proptest::collection::vec(any::<u8>(), 0..8)) {
        let mut encoded = batch::encode(&records).unwrap().to_vec();
        encoded.extend_from_slice(&trailing);
        let decoded = batch::decode(&Bytes::from(encoded), records.len()).unwrap();
        prop_assert_eq!(decoded.len(), records.len());
        for (got, (headers, body)) in decoded.iter().zip(&records) {
            prop_assert_eq!(&as_text(&got.headers), headers);
            prop_assert_eq!(&got.body[..], &body[..]);
        }
    }

    #[test]
    fn a_page_decodes_to_what_was_encoded(records in proptest::collection::vec((any::<u64>(), any::<i64>(), headers(), body()), 0..8)) {
        let mut writer = page::PageWriter::with_capacity(0);
        for (seq, ts, headers, body) in &records {
            writer.record(*seq, *ts, headers, body).unwrap();
        }
        let encoded = writer.finish();
        let decoded = page::decode(&encoded).unwrap();
        prop_assert_eq!(decoded.len(), records.len());
        for (got, (seq, ts, headers, body)) in decoded.iter().zip(&records) {
            prop_assert_eq!(got.seq, *seq);
            prop_assert_eq!(got.timestamp_ms, *ts);
            prop_assert_eq!(&as_text(&got.headers), headers);
            prop_assert_eq!(&got.body[..], &body[..]);
        }
        let walked: Vec<PageRecord> = page::records(&encoded).unwrap().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(walked, decoded);
    }

    #[test]
    fn a_cut_batch_or_page_is_an_error(records in proptest::collection::vec((headers(), body()), 1..4), cut in 0usize..200) {
        let encoded = batch::encode(&records).unwrap();
        if cut < encoded.len() {
            prop_assert!(batch::decode(&encoded.slice(..cut), 16).is_err());
        }
        let pages: Vec<PageRecord> = records.iter().enumerate().map(|(i, (h, b))| PageRecord {
            seq: i as u64,
            timestamp_ms: 1,
            headers: h.iter().map(|(n, v)| (Bytes::from(n.clone()), Bytes::from(v.clone()))).collect(),
            body: Bytes::from(b.clone()),
        }).collect();
        let encoded = page::encode(&pages).unwrap();
        if cut < encoded.len() {
            prop_assert!(page::decode(&encoded.slice(..cut)).is_err());
        }
    }

    /// A JSON batch as any JSON library writes it decodes to its records; header maps come
    /// back sorted with one value per name.
    #[test]
    fn a_json_batch_decodes_to_what_was_encoded(records in proptest::collection::vec((proptest::collection::btree_map(".{0,6}", ".{0,8}", 0..4), body()), 1..8)) {
        let elements: Vec<serde_json::Value> = records.iter().map(|(headers, body)| {
            let mut record = serde_json::json!({ "headers": headers });
            match std::str::from_utf8(body) {
                Ok(text) => record["body"] = text.into(),
                Err(_) => {
                    use base64::Engine as _;
                    record["body_b64"] = base64::engine::general_purpose::STANDARD.encode(body).into();
                }
            }
            record
        }).collect();
        let text = serde_json::json!({ "records": elements }).to_string();
        let decoded = json::decode_batch(&Bytes::from(text), records.len()).unwrap();
        for (got, (headers, body)) in decoded.iter().zip(&records) {
            let want: Headers = headers.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
            prop_assert_eq!(as_text(&got.headers), want);
            prop_assert_eq!(&got.body[..], &body[..]);
        }
    }

    /// A JSON read page is JSON any library reads, with every field where the format says.
    #[test]
    fn a_json_page_reads_back_with_any_json_library(records in proptest::collection::vec((any::<u64>(), any::<i64>(), headers(), body()), 0..8)) {
        let mut writer = json::JsonPageWriter::with_capacity(0);
        for (seq, ts, headers, body) in &records {
            writer.record(*seq, *ts, headers, body);
        }
        let parsed: Vec<serde_json::Value> = serde_json::from_slice(&writer.finish()).unwrap();
        prop_assert_eq!(parsed.len(), records.len());
        for (got, (seq, ts, headers, body)) in parsed.iter().zip(&records) {
            prop_assert_eq!(got["seq"].as_u64(), Some(*seq));
            prop_assert_eq!(got["timestamp"].as_i64(), Some(*ts));
            let body_back = match got.get("body") {
                Some(text) => text.as_str().unwrap().as_bytes().to_vec(),
                None => {
                    use base64::Engine as _;
                    base64::engine::general_purpose::STANDARD.decode(got["body_b64"].as_str().unwrap()).unwrap()
                }
            };
            prop_assert_eq!(&body_back, body);
            let names = got.get("headers").map_or(0, |h| h.as_object().unwrap().len());
            let distinct: std::collections::BTreeSet<_> = headers.iter().map(|(n, _)| n).collect();
            prop_assert_eq!(names, distinct.len());
        }
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let bytes = Bytes::from(bytes);
        let _ = batch::decode(&bytes, 1000);
        let _ = page::decode(&bytes);
        let _ = json::decode_batch(&bytes, 1000);
        let _ = pico_proto::error_body::decode(&bytes);
    }
}
