//! The Pico writes: create (`PUT`), append and trim (`POST`), configure (`PATCH`) and delete,
//! each one engine call; a write that moved a stream's tail wakes the Durable Streams
//! subscriptions watching it, from the engine's own acknowledgement.

use std::rc::Rc;

use pico_engine::{
    limits, rules::ProducerTuple, AppendRequest, CoreHandle, CreateRequest, Created, RecordInput,
    RetentionChange, StreamConfig,
};
use pico_proto::header::*;

use super::error::ApiError;
use super::read::head_response;
use super::settings::PicoSettings;
use crate::codec;
use crate::params::{header_true, producer_tuple, strict_u64, PartialProducer};
use crate::time::parse_rfc3339_ms;
use crate::transport::message::{Request, Response};

fn header_u64(request: &Request, name: &str, display: &str) -> Result<Option<u64>, ApiError> {
    request
        .header(name)
        .map(|v| strict_u64(v).ok_or_else(|| ApiError::bad_request(format!("invalid {display}"))))
        .transpose()
}

fn stream_content_type(request: &Request) -> String {
    request
        .header("content-type")
        .unwrap_or(pico_proto::media::OCTET_STREAM)
        .to_string()
}

/// The retention headers of a create or a `PATCH` (docs/api.md, Retention): the limits the
/// request sets (`0` turns one off).
fn retention_headers(request: &Request) -> Result<RetentionChange, ApiError> {
    type Policy = fn(u64) -> Result<Option<u64>, u64>;
    // `unit`: what the whole number counts, for the refusal of anything else (`7d` is the
    // CLI's syntax, not the header's).
    let limit = |name: &str, display: &str, unit: &str, policy: Policy| {
        header_u64(request, name, display)
            .map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid {display}: expected {unit}; 0 turns the limit off"
                ))
            })?
            .map(|value| {
                policy(value).map_err(|max| {
                    ApiError::bad_request(format!("{display} must be at most {max}"))
                })
            })
            .transpose()
    };
    Ok(RetentionChange {
        age_ms: limit(
            PICO_RETENTION_AGE,
            "Pico-Retention-Age",
            "whole seconds (604800 is 7 days)",
            limits::retention_secs,
        )?,
        bytes: limit(
            PICO_RETENTION_BYTES,
            "Pico-Retention-Bytes",
            "a whole number of bytes",
            limits::retention_bytes,
        )?,
        delete_on_empty_ms: limit(
            PICO_DELETE_ON_EMPTY,
            "Pico-Delete-On-Empty",
            "whole seconds",
            limits::retention_secs,
        )?,
    })
}

/// `PATCH /stream` with retention headers: replaces the limits it names, keeps the others.
pub(super) async fn configure(
    core: &Rc<CoreHandle>,
    request: &Request,
) -> Result<Response, ApiError> {
    let change = retention_headers(request)?;
    let info = core.configure(&request.path, change).await?;
    Ok(head_response(&info))
}

pub(super) async fn create(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    request: &Request,
) -> Result<Response, ApiError> {
    let ttl_sec = header_u64(request, PICO_TTL, "Pico-TTL")?;
    if ttl_sec.is_some_and(|ttl| ttl > limits::TTL_SEC_MAX) {
        return Err(ApiError::bad_request(format!(
            "Pico-TTL must be at most {} seconds",
            limits::TTL_SEC_MAX
        )));
    }
    let expires_at_ms = request
        .header(PICO_EXPIRES_AT)
        .map(|v| {
            parse_rfc3339_ms(v).ok_or_else(|| ApiError::bad_request("invalid Pico-Expires-At"))
        })
        .transpose()?;
    if ttl_sec.is_some() && expires_at_ms.is_some() {
        return Err(ApiError::bad_request(
            "Pico-TTL and Pico-Expires-At both set",
        ));
    }
    crate::params::check_expiry(ttl_sec, expires_at_ms, "Pico-TTL", "Pico-Expires-At")
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let closed = header_true(request, PICO_CLOSED);
    let config = StreamConfig {
        content_type: stream_content_type(request),
        ttl_sec,
        expires_at_ms,
        retention: retention_headers(request)?.apply(settings.default_retention),
    };
    // A body given with the create becomes the stream's first record.
    let records = if request.body.is_empty() {
        Vec::new()
    } else {
        vec![RecordInput {
            headers: Vec::new(),
            body: request.body.clone(),
        }]
    };
    let create = CreateRequest {
        config,
        closed,
        records,
        fork: None,
    };
    let Created { created, info, .. } = core.create(&request.path, create).await?;
    let mut response = Response::new(if created { 201 } else { 200 })
        .header(PICO_NEXT_SEQ, info.next_offset.to_string())
        .header("content-type", info.content_type.clone())
        .header("cache-control", "no-store");
    if info.closed {
        response = response.header(PICO_CLOSED, "true");
    }
    if created {
        response = response.header("location", request.path.clone());
    }
    Ok(response)
}

pub(super) async fn append(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
    let match_offset = header_u64(request, PICO_MATCH_SEQ, "Pico-Match-Seq")?;
    let producer = producer_headers(request)?;
    if let Some(raw) = request.header(PICO_TRIM_SEQ) {
        let offset =
            strict_u64(raw).ok_or_else(|| ApiError::bad_request("invalid Pico-Trim-Seq"))?;
        return trim(core, request, offset).await;
    }
    let close = header_true(request, PICO_CLOSED);
    if request.body.is_empty() && !close {
        return Err(ApiError::bad_request("empty body"));
    }
    let records = if request.body.is_empty() {
        Vec::new()
    } else {
        let base = pico_engine::rules::mime_base(request.header("content-type").unwrap_or(""));
        if base.eq_ignore_ascii_case(codec::BINARY_BATCH_TYPE) {
            codec::decode_binary_batch(&request.body, limits::RECORDS_PER_APPEND_MAX)
                .map_err(|e| ApiError::bad_request(e.to_string()))?
        } else if base.eq_ignore_ascii_case(codec::JSON_BATCH_TYPE) {
            codec::decode_json_batch(&request.body, limits::RECORDS_PER_APPEND_MAX)
                .map_err(|e| ApiError::bad_request(e.to_string()))?
        } else {
            vec![RecordInput {
                headers: Vec::new(),
                body: request.body.clone(),
            }]
        }
    };
    if records.is_empty() && !close {
        return Err(ApiError::bad_request("empty body"));
    }
    let echo = producer.as_ref().map(|p| (p.epoch, p.seq));
    let append = AppendRequest {
        records,
        close,
        match_offset,
        producer,
        content_type: None,
        writer_seq: None,
        json_checked: false,
    };
    let ack = core.append(&request.path, append).await?;
    let mut response = Response::new(200)
        .header(PICO_NEXT_SEQ, ack.next_offset.to_string())
        .header("cache-control", "no-store");
    if let (Some(start), Some(timestamp)) = (ack.start_offset, ack.timestamp_ms) {
        response = response
            .header(PICO_START_SEQ, start.to_string())
            .header(PICO_TIMESTAMP, timestamp.to_string());
    }
    if ack.closed {
        response = response.header(PICO_CLOSED, "true");
    }
    if let Some((epoch, seq)) = echo {
        // On a duplicate the sequence echoed is the producer's highest accepted one.
        let seq = ack.duplicate_of_seq.unwrap_or(seq);
        response = response
            .header(PICO_PRODUCER_EPOCH, epoch.to_string())
            .header(PICO_PRODUCER_SEQ, seq.to_string());
    }
    Ok(response)
}

/// `Pico-Producer-Id/Epoch/Seq`: all three or none.
pub(super) fn producer_headers(request: &Request) -> Result<Option<ProducerTuple>, ApiError> {
    let id = request.header(PICO_PRODUCER_ID);
    let epoch = header_u64(request, PICO_PRODUCER_EPOCH, "Pico-Producer-Epoch")?;
    let seq = header_u64(request, PICO_PRODUCER_SEQ, "Pico-Producer-Seq")?;
    producer_tuple(id, epoch, seq).map_err(|PartialProducer| {
        ApiError::bad_request(
            "all producer headers (Pico-Producer-Id, Pico-Producer-Epoch, Pico-Producer-Seq) must be provided together",
        )
    })
}

/// `POST` with `Pico-Trim-Seq`: records below the offset are gone for readers at once.
pub(super) async fn trim(
    core: &Rc<CoreHandle>,
    request: &Request,
    offset: u64,
) -> Result<Response, ApiError> {
    if !request.body.is_empty() {
        return Err(ApiError::bad_request("trim takes no body"));
    }
    let start_offset = core.trim(&request.path, offset).await?;
    Ok(Response::new(200)
        .header(PICO_START_SEQ, start_offset.to_string())
        .header("cache-control", "no-store"))
}

pub(super) async fn delete(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
    core.delete(&request.path).await?;
    Ok(Response::new(204).header("cache-control", "no-store"))
}
