//! The Durable Streams reads: `HEAD`, and catch-up and long-poll reads with their caching
//! headers; an SSE read is handed to `sse.rs`.

use std::rc::Rc;

use pico_engine::{limits, CoreHandle, ReadFrom, ReadRequest, StreamInfo};
use pico_proto::header::*;

use super::encode::{encode, next_cursor};
use super::error::DsError;
use super::params::{format_offset, is_json, parse_offset, DsSettings, Position, CATCH_UP_CACHE};
use super::sse::sse;
use crate::params::query_values;
use crate::time::format_rfc3339_ms;
use crate::transport::message::{Request, Response};

pub(super) async fn head(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, DsError> {
    let info = core.head(&request.path).await?;
    Ok(head_response(&info))
}

pub(super) fn head_response(info: &StreamInfo) -> Response {
    let mut response = Response::new(200)
        .header("content-type", info.content_type.clone())
        .header(STREAM_NEXT_OFFSET, format_offset(info.next_offset, 0))
        .header("cache-control", "no-store");
    if info.closed {
        response = response.header(STREAM_CLOSED, "true");
    }
    if let Some(ttl) = info.ttl_sec {
        response = response.header(STREAM_TTL, ttl.to_string());
    }
    if let Some(at) = info.expires_at_ms {
        response = response.header(STREAM_EXPIRES_AT, format_rfc3339_ms(at));
    }
    response
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Live {
    CatchUp,
    LongPoll,
    Sse,
}

pub(super) async fn read(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    request: &Request,
) -> Result<Response, DsError> {
    let query = request.query.as_str();
    let offsets = query_values(query, "offset");
    if offsets.len() > 1 {
        return Err(DsError::bad_request("offset given more than once"));
    }
    let position = match offsets.first() {
        None => None,
        Some(text) if text.is_empty() => return Err(DsError::bad_request("empty offset")),
        Some(text) => Some(parse_offset(text)?),
    };
    let live = match query_values(query, "live").first().map(String::as_str) {
        None | Some("") | Some("false") => Live::CatchUp,
        Some("long-poll") => Live::LongPoll,
        Some("sse") => Live::Sse,
        Some(other) => return Err(DsError::bad_request(format!("invalid live mode: {other}"))),
    };
    if live != Live::CatchUp && position.is_none() {
        return Err(DsError::bad_request("live reads need an offset"));
    }
    let (from, skip_bytes) = match position.unwrap_or(Position::Start) {
        Position::Start => (ReadFrom::START, 0),
        Position::Now => (ReadFrom::Tail, 0),
        Position::At { seq, bytes } => (ReadFrom::Offset(seq), bytes),
    };
    let cursor = query_values(query, "cursor").into_iter().next();
    if live == Live::Sse {
        // Boxed: its setup (a `HEAD` of the stream) is larger than a long-poll's whole
        // read, and inline it sized every parked long-poll's future (2.1 KiB of 2.8).
        return Box::pin(sse(core, settings, request, from, skip_bytes, cursor)).await;
    }
    let read_request = ReadRequest {
        from,
        max_records: limits::RECORDS_PER_READ_MAX,
        max_bytes: match live {
            Live::CatchUp => settings.catch_up_bytes,
            _ => settings.max_chunk_size,
        },
        wait_ms: (live == Live::LongPoll).then_some(settings.long_poll_timeout_ms),
        with_content_type: true,
        bound: None,
    };
    let mut batch = core.read(&request.path, &read_request).await?;
    let content_type = batch.content_type.take().unwrap_or_default();
    let json = is_json(&content_type);
    let body = encode(&batch, json, skip_bytes);
    let next = format_offset(batch.next_offset, 0);
    let mut response = if live == Live::LongPoll && batch.records.is_empty() {
        Response::new(204)
    } else {
        Response::new(200)
            .header("content-type", content_type)
            .with_parts(body)
    };
    response = response.header(STREAM_NEXT_OFFSET, next.clone());
    if batch.up_to_date() {
        response = response.header(STREAM_UP_TO_DATE, "true");
    }
    if batch.closed {
        response = response.header(STREAM_CLOSED, "true");
    }
    match live {
        Live::LongPoll => {
            if !batch.closed {
                response = response.header(STREAM_CURSOR, next_cursor(cursor.as_deref()));
            }
            Ok(response.header("cache-control", "no-store"))
        }
        _ if from == ReadFrom::Tail => Ok(response.header("cache-control", "no-store")),
        _ => {
            let etag = format!(
                "\"{}:{next}{}\"",
                format_offset(batch.from, skip_bytes),
                if batch.closed { ":c" } else { "" }
            );
            let cache = if batch.up_to_date() {
                "no-cache"
            } else {
                CATCH_UP_CACHE
            };
            response = response
                .header("etag", etag.clone())
                .header("cache-control", cache);
            if request.header("if-none-match") == Some(etag.as_str()) {
                response.status = 304;
                response.clear_body();
                response.headers.retain(|(name, _)| *name != "content-type");
            }
            Ok(response)
        }
    }
}
