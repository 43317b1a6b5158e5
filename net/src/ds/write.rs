//! The Durable Streams writes: create (with a fork), append (with producers) and delete, each
//! one engine call; a write that moved a stream's tail wakes the subscriptions watching it,
//! from the engine's own acknowledgement.

use std::rc::Rc;

use bytes::Bytes;
use pico_engine::{
    limits, rules::ProducerTuple, AppendRequest, CoreHandle, CreateRequest, Created, ForkSpec,
    RecordInput, StreamConfig,
};
use pico_proto::header::*;

use super::error::DsError;
use super::params::{
    base_url, fork_source_path, format_offset, is_json, parse_offset, DsSettings, Position,
};
use crate::params::{header_true, producer_tuple, strict_u64, PartialProducer};
use crate::time::parse_rfc3339_ms;
use crate::transport::message::{Request, Response};

/// Largest integer a producer epoch or sequence may be (JavaScript's safe integers).
const PRODUCER_NUMBER_MAX: u64 = (1 << 53) - 1;

/// The messages of a body: JSON mode flattens a top-level array one level (each element a
/// record, sliced from the body without copying); otherwise the body is one record.
pub(super) fn body_records(
    body: &Bytes,
    json: bool,
    allow_empty_array: bool,
) -> Result<Vec<RecordInput>, DsError> {
    let record = |body: Bytes| RecordInput {
        headers: Vec::new(),
        body,
    };
    if body.is_empty() {
        return Ok(Vec::new());
    }
    if !json {
        return Ok(vec![record(body.clone())]);
    }
    let invalid = |e: serde_json::Error| DsError::bad_request(format!("invalid JSON: {e}"));
    let value: &serde_json::value::RawValue = serde_json::from_slice(body).map_err(invalid)?;
    let text = value.get();
    let slice_of = |part: &str| {
        let start = part.as_ptr() as usize - body.as_ptr() as usize;
        body.slice(start..start + part.len())
    };
    let checked = |part: &str| {
        pico_engine::json::check_parsed_value(part.as_bytes())
            .map_err(|why| DsError::bad_request(format!("invalid JSON: {why}")))
    };
    if !text.starts_with('[') {
        checked(text)?;
        return Ok(vec![record(slice_of(text))]);
    }
    let too_many = std::cell::Cell::new(false);
    let elements = serde::de::Deserializer::deserialize_seq(
        &mut serde_json::Deserializer::from_str(text),
        ArrayElements {
            max: limits::RECORDS_PER_APPEND_MAX,
            too_many: &too_many,
        },
    );
    let elements = match elements {
        Ok(elements) => elements,
        Err(_) if too_many.get() => {
            return Err(DsError::bad_request(format!(
                "at most {} messages per append",
                limits::RECORDS_PER_APPEND_MAX
            )))
        }
        Err(e) => return Err(invalid(e)),
    };
    if elements.is_empty() && !allow_empty_array {
        return Err(DsError::bad_request("empty JSON array"));
    }
    // `text` borrows `body` (serde_json::from_slice on a &[u8] borrows), so do its parts.
    elements
        .into_iter()
        .map(|element| {
            checked(element.get())?;
            Ok(record(slice_of(element.get())))
        })
        .collect()
}

/// The elements of a JSON array as slices of it, at most `max` of them: a small body can
/// hold millions of `0,`, refused as they are read instead of all collected first.
struct ArrayElements<'c> {
    max: usize,
    /// Set when the array was longer than `max` (the error is then that, not bad JSON).
    too_many: &'c std::cell::Cell<bool>,
}

impl<'de> serde::de::Visitor<'de> for ArrayElements<'_> {
    type Value = Vec<&'de serde_json::value::RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut elements = Vec::new();
        while let Some(element) = seq.next_element()? {
            if elements.len() == self.max {
                self.too_many.set(true);
                return Err(serde::de::Error::custom("too many elements"));
            }
            elements.push(element);
        }
        Ok(elements)
    }
}

fn ttl_header(request: &Request) -> Result<(Option<u64>, Option<i64>), DsError> {
    let ttl = request
        .header(STREAM_TTL)
        .map(|v| strict_u64(v).ok_or_else(|| DsError::bad_request("invalid Stream-TTL")))
        .transpose()?;
    if ttl.is_some_and(|ttl| ttl > limits::TTL_SEC_MAX) {
        return Err(DsError::bad_request(format!(
            "Stream-TTL must be at most {} seconds",
            limits::TTL_SEC_MAX
        )));
    }
    let expires = request
        .header(STREAM_EXPIRES_AT)
        .map(|v| {
            parse_rfc3339_ms(v).ok_or_else(|| DsError::bad_request("invalid Stream-Expires-At"))
        })
        .transpose()?;
    if ttl.is_some() && expires.is_some() {
        return Err(DsError::bad_request(
            "Stream-TTL and Stream-Expires-At are mutually exclusive",
        ));
    }
    crate::params::check_expiry(ttl, expires, "Stream-TTL", "Stream-Expires-At")
        .map_err(|e| DsError::bad_request(e.to_string()))?;
    Ok((ttl, expires))
}

fn fork_spec(request: &Request) -> Result<Option<ForkSpec>, DsError> {
    let source = request.header(STREAM_FORKED_FROM);
    let offset = request.header(STREAM_FORK_OFFSET);
    let sub = request
        .headers
        .iter()
        .any(|(n, _)| n == STREAM_FORK_SUB_OFFSET)
        .then(|| request.header(STREAM_FORK_SUB_OFFSET).unwrap_or(""));
    let Some(source) = source else {
        if sub.is_some() || offset.is_some() {
            return Err(DsError::bad_request(
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
            ));
        }
        return Ok(None);
    };
    let sub_offset = match sub {
        None => 0,
        Some(text) => strict_u64(text)
            .or_else(|| {
                // Leading zeros are harmless here; signs, fractions and exponents are not.
                (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| text.parse().ok())
                    .flatten()
            })
            .ok_or_else(|| DsError::bad_request("invalid Stream-Fork-Sub-Offset"))?,
    };
    let (offset, offset_bytes) = match offset.map(parse_offset).transpose()? {
        None if sub_offset > 0 => {
            return Err(DsError::bad_request(
                "Stream-Fork-Sub-Offset needs Stream-Fork-Offset",
            ))
        }
        None | Some(Position::Now) => (None, 0),
        Some(Position::Start) => (Some(0), 0),
        Some(Position::At { seq, bytes }) => (Some(seq), bytes),
    };
    Ok(Some(ForkSpec {
        source: fork_source_path(source).to_string(),
        offset,
        offset_bytes,
        sub_offset,
    }))
}

pub(super) async fn create(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    request: &Request,
) -> Result<Response, DsError> {
    let (ttl_sec, expires_at_ms) = ttl_header(request)?;
    let fork = fork_spec(request)?;
    let closed = header_true(request, STREAM_CLOSED);
    // A fork without a content type takes its source's (resolved by the engine).
    let content_type = match (request.header("content-type"), &fork) {
        (Some(given), _) => given.to_string(),
        (None, Some(_)) => String::new(),
        (None, None) => pico_proto::media::OCTET_STREAM.to_string(),
    };
    let records = body_records(&request.body, is_json(&content_type), true)?;
    let create = CreateRequest {
        config: StreamConfig {
            content_type,
            ttl_sec,
            expires_at_ms,
            retention: settings.default_retention,
        },
        closed,
        records,
        fork,
    };
    let Created { created, info, .. } = core.create(&request.path, create).await?;
    let next = format_offset(info.next_offset, 0);
    let mut response = Response::new(if created { 201 } else { 200 })
        .header("content-type", info.content_type.clone())
        .header(STREAM_NEXT_OFFSET, next)
        .header("cache-control", "no-store");
    if info.closed {
        response = response.header(STREAM_CLOSED, "true");
    }
    if created {
        let location = format!("{}{}", base_url(settings, request), request.path);
        response = response.header("location", location);
    }
    Ok(response)
}

/// A producer number: plain decimal digits, at most 2^53 − 1.
fn producer_number(request: &Request, name: &str) -> Result<Option<u64>, DsError> {
    request
        .header(name)
        .map(|text| {
            (text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty())
                .then(|| text.parse::<u64>().ok())
                .flatten()
                .filter(|&n| n <= PRODUCER_NUMBER_MAX)
                .ok_or_else(|| DsError::bad_request(format!("invalid {name}: {text:?}")))
        })
        .transpose()
}

pub(super) fn producer_headers(request: &Request) -> Result<Option<ProducerTuple>, DsError> {
    let id = request.header(PRODUCER_ID);
    let epoch = producer_number(request, PRODUCER_EPOCH)?;
    let seq = producer_number(request, PRODUCER_SEQ)?;
    producer_tuple(id, epoch, seq).map_err(|PartialProducer| {
        DsError::bad_request("Producer-Id, Producer-Epoch and Producer-Seq must be sent together")
    })
}

pub(super) async fn append(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, DsError> {
    let producer = producer_headers(request)?;
    let close = header_true(request, STREAM_CLOSED);
    let body = &request.body;
    if body.is_empty() && !close {
        return Err(DsError::bad_request(
            "an append needs a body (or Stream-Closed: true to close)",
        ));
    }
    let content_type = if body.is_empty() {
        None
    } else {
        Some(
            request
                .header("content-type")
                .ok_or_else(|| DsError::bad_request("an append with a body needs a Content-Type"))?
                .to_string(),
        )
    };
    let json = content_type.as_deref().is_some_and(is_json);
    let records = body_records(body, json, false)?;
    let echo = producer.as_ref().map(|p| p.epoch);
    let append = AppendRequest {
        records,
        close,
        match_offset: None,
        producer,
        content_type,
        writer_seq: request.header(STREAM_SEQ).map(str::to_string),
        json_checked: json,
    };
    let ack = core.append(&request.path, append).await?;
    let next = format_offset(ack.next_offset, 0);
    // A producer's new data is 200; a duplicate, a close-only and a plain append are 204.
    let status = match (&echo, ack.start_offset, ack.duplicate_of_seq) {
        (Some(_), Some(_), None) => 200,
        _ => 204,
    };
    let mut response = Response::new(status)
        .header(STREAM_NEXT_OFFSET, next)
        .header("cache-control", "no-store");
    if ack.closed {
        response = response.header(STREAM_CLOSED, "true");
    }
    if let (Some(epoch), Some(seq)) = (echo, request.header(PRODUCER_SEQ)) {
        let seq = ack
            .duplicate_of_seq
            .map_or_else(|| seq.to_string(), |s| s.to_string());
        response = response
            .header(PRODUCER_EPOCH, epoch.to_string())
            .header(PRODUCER_SEQ, seq);
    }
    Ok(response)
}

pub(super) async fn delete(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, DsError> {
    core.delete(&request.path).await?;
    Ok(Response::new(204).header("cache-control", "no-store"))
}
