//! The Pico JSON formats (`docs/api.md`): the JSON append batch,
//! `Content-Type: application/vnd.picomq.batch+json`,
//!
//! ```text
//! {"records":[{"headers":{"k":"v",..}?,"body":"text"|"body_b64":"base64"},..]}
//! ```
//!
//! and the `format=json` read page,
//!
//! ```text
//! [{"seq":N,"timestamp":MS,"headers"?:{..},"body":"text"|"body_b64":"base64"},..]
//! ```
//!
//! A body that is UTF-8 travels as `body`, any other as `body_b64` (standard base64).

use base64::Engine as _;
use bytes::Bytes;

use crate::batch::Record;

/// Decodes a JSON append batch: `{"records":[{"headers":{..},"body":"..."|"body_b64":".."}]}`.
///
/// Decoding stops at `max_records` records: a small body can hold millions of `{}`, which are
/// refused as they are read, never all built first. Each record must be an object; `body` and
/// `body_b64`, when present, must be strings; such an error names the record's index. A `body`
/// without escapes is a slice of `body` (no copy).
pub fn decode_batch(body: &Bytes, max_records: usize) -> Result<Vec<Record>, String> {
    use serde::de::DeserializeSeed;
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let decoding = std::cell::Cell::new(None);
    let batch = JsonBatch {
        body,
        max_records,
        decoding: &decoding,
    };
    let decoded = batch
        .deserialize(&mut deserializer)
        .and_then(|records| deserializer.end().map(|()| records));
    match decoded {
        Ok(records) => Ok(records),
        // A record of the wrong shape is named; broken JSON anywhere is just that.
        Err(e) if e.is_data() => Err(match decoding.get() {
            Some(index) => format!("record {index}: {}", strip_position(e.to_string())),
            None => strip_position(e.to_string()),
        }),
        Err(_) => Err("invalid JSON".into()),
    }
}

const RECORDS_NOT_AN_ARRAY: &str = "records must be a non-empty array";

/// `message` without serde_json's trailing ` at line L column C`.
fn strip_position(message: String) -> String {
    let Some(at) = message.rfind(" at line ") else {
        return message;
    };
    let tail = &message[at + " at line ".len()..];
    let is_position = tail.split_once(" column ").is_some_and(|(line, column)| {
        [line, column]
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if is_position {
        message[..at].to_string()
    } else {
        message
    }
}

/// Answers every JSON type but the ones a visitor takes with the same error.
macro_rules! refuse_other_types {
    ($message:expr) => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(E::custom($message))
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Err(E::custom($message))
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Err(E::custom($message))
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(E::custom($message))
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Err(E::custom($message))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Err(E::custom($message))
        }
    };
}

/// The root object; `records` is read by [`JsonRecords`], other keys are skipped.
#[derive(Clone, Copy)]
struct JsonBatch<'b> {
    body: &'b Bytes,
    max_records: usize,
    /// The index of the record being decoded, for the error message.
    decoding: &'b std::cell::Cell<Option<usize>>,
}

/// The `records` array, at most `max_records` long.
struct JsonRecords<'b>(JsonBatch<'b>);

/// One record object.
struct JsonRecord<'b> {
    body: &'b Bytes,
}

/// A field that must be a string when present (`body`, `body_b64`).
struct JsonText(&'static str);

impl<'de> serde::de::DeserializeSeed<'de> for JsonBatch<'_> {
    type Value = Vec<Record>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonBatch<'_> {
    type Value = Vec<Record>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(RECORDS_NOT_AN_ARRAY)
    }

    refuse_other_types!(RECORDS_NOT_AN_ARRAY);

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(serde::de::Error::custom(RECORDS_NOT_AN_ARRAY))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut records = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "records" {
                records = Some(map.next_value_seed(JsonRecords(self))?);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        records
            .filter(|records: &Vec<Record>| !records.is_empty())
            .ok_or_else(|| serde::de::Error::custom(RECORDS_NOT_AN_ARRAY))
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for JsonRecords<'_> {
    type Value = Vec<Record>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonRecords<'_> {
    type Value = Vec<Record>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(RECORDS_NOT_AN_ARRAY)
    }

    refuse_other_types!(RECORDS_NOT_AN_ARRAY);

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(serde::de::Error::custom(RECORDS_NOT_AN_ARRAY))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let JsonBatch {
            body,
            max_records,
            decoding,
        } = self.0;
        let mut records = Vec::new();
        loop {
            let index = records.len();
            decoding.set(Some(index));
            let record = seq.next_element_seed(JsonRecord { body })?;
            decoding.set(None);
            let Some(record) = record else {
                return Ok(records);
            };
            if index == max_records {
                return Err(serde::de::Error::custom(format!(
                    "at most {max_records} records per append"
                )));
            }
            records.push(record);
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for JsonRecord<'_> {
    type Value = Record;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

const RECORD_NOT_AN_OBJECT: &str = "a record must be an object with body or body_b64";

impl<'de> serde::de::Visitor<'de> for JsonRecord<'_> {
    type Value = Record;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(RECORD_NOT_AN_OBJECT)
    }

    refuse_other_types!(RECORD_NOT_AN_OBJECT);

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(serde::de::Error::custom(RECORD_NOT_AN_OBJECT))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error as _;
        type HeaderMap<'a> = std::collections::BTreeMap<String, &'a serde_json::value::RawValue>;
        let mut headers: Option<HeaderMap<'de>> = None;
        let (mut text, mut base64) = (None, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "headers" => headers = map.next_value::<Option<HeaderMap<'de>>>()?,
                "body" => text = Some(map.next_value_seed(JsonText("body"))?),
                "body_b64" => base64 = Some(map.next_value_seed(JsonText("body_b64"))?),
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let body = match (base64, text) {
            // `body_b64` wins when both are given.
            (Some(encoded), _) => base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .map_err(|_| A::Error::custom("invalid body_b64"))?
                .into(),
            (None, Some(std::borrow::Cow::Borrowed(text))) => slice_or_copy(self.body, text),
            (None, Some(std::borrow::Cow::Owned(text))) => Bytes::from(text),
            (None, None) => Bytes::new(),
        };
        let mut record_headers = Vec::new();
        for (name, value) in headers.unwrap_or_default() {
            // String values are kept as they are; any other value as its compact JSON text.
            let value = match serde_json::from_str::<String>(value.get()) {
                Ok(text) => text,
                Err(_) => serde_json::from_str::<serde_json::Value>(value.get())
                    .map_err(A::Error::custom)?
                    .to_string(),
            };
            record_headers.push((Bytes::from(name), Bytes::from(value)));
        }
        Ok(Record {
            headers: record_headers,
            body,
        })
    }
}

/// `text` as a slice of `body` when it lies within it (it was not unescaped), else a copy.
fn slice_or_copy(body: &Bytes, text: &str) -> Bytes {
    let start = (text.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
    match start.checked_add(text.len()) {
        Some(end) if start <= body.len() && end <= body.len() => body.slice(start..end),
        _ => Bytes::copy_from_slice(text.as_bytes()),
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for JsonText {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonText {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} to be a string", self.0)
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(text))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(text.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(text))
    }
}

/// Builds a `format=json` read page record by record.
pub struct JsonPageWriter {
    out: Vec<u8>,
    first: bool,
}

impl JsonPageWriter {
    /// `bytes`: the expected size of the records' bodies, to allocate once.
    pub fn with_capacity(bytes: usize) -> JsonPageWriter {
        let mut out = Vec::with_capacity(bytes + 2);
        out.push(b'[');
        JsonPageWriter { out, first: true }
    }

    /// The size a record adds to a page beyond its body, roughly: what to reserve.
    pub const RECORD_OVERHEAD_BYTES: usize = 48;

    /// Adds a record; header names and values that are not UTF-8 are shown lossily.
    pub fn record<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        seq: u64,
        timestamp_ms: i64,
        headers: &[(N, V)],
        body: &[u8],
    ) {
        let out = &mut self.out;
        if !self.first {
            out.push(b',');
        }
        self.first = false;
        out.extend_from_slice(format!("{{\"seq\":{seq},\"timestamp\":{timestamp_ms}").as_bytes());
        if !headers.is_empty() {
            out.extend_from_slice(b",\"headers\":{");
            for (j, (name, value)) in headers.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                string(out, &String::from_utf8_lossy(name.as_ref()));
                out.push(b':');
                string(out, &String::from_utf8_lossy(value.as_ref()));
            }
            out.push(b'}');
        }
        match std::str::from_utf8(body) {
            Ok(text) => {
                out.extend_from_slice(b",\"body\":");
                string(out, text);
            }
            Err(_) => {
                out.extend_from_slice(b",\"body_b64\":\"");
                out.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(body)
                        .as_bytes(),
                );
                out.push(b'"');
            }
        }
        out.push(b'}');
    }

    pub fn finish(mut self) -> Bytes {
        self.out.push(b']');
        self.out.into()
    }
}

/// Appends `text` as a JSON string literal.
pub fn string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(
        serde_json::to_string(text)
            .expect("strings always serialize")
            .as_bytes(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 100_000;

    fn json(body: &[u8]) -> Result<Vec<Record>, String> {
        decode_batch(&Bytes::copy_from_slice(body), LIMIT)
    }

    #[test]
    fn json_records_of_the_wrong_type_are_refused_by_index() {
        for (record, message) in [
            (
                "1",
                "record 1: a record must be an object with body or body_b64",
            ),
            (
                "\"x\"",
                "record 1: a record must be an object with body or body_b64",
            ),
            (
                "null",
                "record 1: a record must be an object with body or body_b64",
            ),
            (
                "[]",
                "record 1: a record must be an object with body or body_b64",
            ),
            (
                r#"{"body":123}"#,
                "record 1: invalid type: integer `123`, expected body to be a string",
            ),
            (
                r#"{"body":{}}"#,
                "record 1: invalid type: map, expected body to be a string",
            ),
            (
                r#"{"body":null}"#,
                "record 1: invalid type: null, expected body to be a string",
            ),
            (
                r#"{"body_b64":7}"#,
                "record 1: invalid type: integer `7`, expected body_b64 to be a string",
            ),
            (
                r#"{"headers":5}"#,
                "record 1: invalid type: integer `5`, expected a map",
            ),
        ] {
            let body = format!(r#"{{"records":[{{"body":"ok"}},{record}]}}"#);
            assert_eq!(json(body.as_bytes()).unwrap_err(), message, "{body}");
        }
        for root in ["1", "[]", r#"{"records":{}}"#, r#"{"records":"x"}"#, "{}"] {
            assert_eq!(
                json(root.as_bytes()).unwrap_err(),
                RECORDS_NOT_AN_ARRAY,
                "{root}"
            );
        }
        assert_eq!(json(br#"{"records":[{}]} x"#).unwrap_err(), "invalid JSON");
        for broken in [
            &br#"{"records":["#[..],
            br#"{"records":[{"body":"#,
            br#"{"records":[{},"#,
        ] {
            assert_eq!(json(broken).unwrap_err(), "invalid JSON", "{broken:?}");
        }
    }

    #[test]
    fn json_batches_stop_decoding_at_the_record_limit() {
        let body = format!(r#"{{"records":[{}{{}}]}}"#, "{},".repeat(LIMIT));
        assert_eq!(
            json(body.as_bytes()).unwrap_err(),
            format!("at most {LIMIT} records per append")
        );
        let fits = decode_batch(
            &Bytes::from(format!(r#"{{"records":[{}{{}}]}}"#, "{},".repeat(9))),
            10,
        );
        assert_eq!(fits.unwrap().len(), 10);
    }

    #[test]
    fn json_bodies_without_escapes_are_not_copied() {
        let body = Bytes::from_static(br#"{"records":[{"body":"plain"},{"body":"a\nb"}]}"#);
        let records = decode_batch(&body, LIMIT).unwrap();
        let plain = &records[0].body;
        assert_eq!(&plain[..], b"plain");
        let inside = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
        assert!(inside.contains(&(plain.as_ptr() as usize)));
        assert_eq!(&records[1].body[..], b"a\nb");
    }

    #[test]
    fn json_batch_forms() {
        let body = br#"{"records":[{"headers":{"k":"v","n":1},"body":"three"},{"body_b64":"AAECgP8="},{}]}"#;
        let records = json(body).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(&records[0].body[..], b"three");
        assert_eq!(records[0].headers[1], (Bytes::from("n"), Bytes::from("1")));
        assert_eq!(&records[1].body[..], &[0, 1, 2, 0x80, 0xff]);
        assert!(records[2].body.is_empty());
        assert_eq!(json(b"{").unwrap_err(), "invalid JSON");
        assert_eq!(
            json(br#"{"records":[]}"#).unwrap_err(),
            "records must be a non-empty array"
        );
        assert_eq!(
            json(br#"{"records":[{"body_b64":"!"}]}"#).unwrap_err(),
            "record 0: invalid body_b64"
        );
    }
}
