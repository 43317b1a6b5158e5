//! The Pico reads: catch-up and long-poll reads in three formats, the start of an SSE
//! response, `HEAD` and the listing of streams.

use std::rc::Rc;

use base64::Engine as _;
use bytes::Bytes;
use pico_engine::{limits, CoreHandle, ReadBatch, ReadError, ReadFrom, ReadRequest, StreamInfo};
use pico_meta::Retention;
use pico_proto::header::*;

use super::error::ApiError;
use super::settings::PicoSettings;
use super::sse;
use crate::codec;
use crate::live_response::LiveCursor;
use crate::params::{query_param, strict_u64};
use crate::time::format_rfc3339_ms;
use crate::transport::message::{Request, Response};

pub(super) const CATCH_UP_CACHE: &str = "public, max-age=60, stale-while-revalidate=300";

/// The retention headers of a HEAD or `PATCH` answer: the limits that are on.
fn with_retention(mut response: Response, retention: &Retention) -> Response {
    if let Some(ms) = retention.age_ms {
        response = response.header(PICO_RETENTION_AGE, (ms / 1000).to_string());
    }
    if let Some(bytes) = retention.bytes {
        response = response.header(PICO_RETENTION_BYTES, bytes.to_string());
    }
    if let Some(ms) = retention.delete_on_empty_ms {
        response = response.header(PICO_DELETE_ON_EMPTY, (ms / 1000).to_string());
    }
    response
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Binary,
    Raw,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Binary => "binary",
            Format::Raw => "raw",
        }
    }
}

/// `seq` / `Last-Event-ID`: signed decimal, negative = beginning (of a trimmed stream: its
/// first readable record), `now` = tail.
fn parse_position(raw: &str, allow_now: bool) -> Result<ReadFrom, ApiError> {
    if raw.is_empty() {
        return Err(ApiError::bad_request("empty offset"));
    }
    if allow_now && raw.eq_ignore_ascii_case("now") {
        return Ok(ReadFrom::Tail);
    }
    let value: i64 = raw
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid offset token: {raw}")))?;
    Ok(u64::try_from(value).map_or(ReadFrom::START, ReadFrom::Offset))
}

pub(super) async fn read(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    request: &Request,
) -> Result<Response, ApiError> {
    let query = request.query.as_str();
    let from = match query_param(query, "seq") {
        Some(raw) => parse_position(&raw, true)?,
        None => match request.header("last-event-id") {
            Some(raw) => parse_position(raw, false)?,
            // An absent `seq` is 0 (after a trim, `410` naming the start): docs/api.md, "Read".
            None => ReadFrom::Offset(0),
        },
    };
    let strict = |key: &str| -> Result<Option<u64>, ApiError> {
        query_param(query, key)
            .map(|v| strict_u64(&v).ok_or_else(|| ApiError::bad_request(format!("invalid {key}"))))
            .transpose()
    };
    let max_records = match strict("count")? {
        None | Some(0) => limits::RECORDS_PER_READ_MAX,
        Some(n) => n.min(limits::RECORDS_PER_READ_MAX as u64) as usize,
    };
    let default_bytes = settings.max_chunk_size;
    let max_bytes = match strict("bytes")? {
        None | Some(0) => default_bytes,
        Some(n) => n.min(default_bytes.max(limits::READ_BYTES_MAX) as u64) as usize,
    };
    let format = match query_param(query, "format").as_deref() {
        None | Some("json") => Format::Json,
        Some("binary") => Format::Binary,
        Some("raw") => Format::Raw,
        Some(other) => return Err(ApiError::bad_request(format!("invalid format: {other}"))),
    };
    let accepts_sse = request
        .header("accept")
        .is_some_and(|a| a.contains(pico_proto::media::EVENT_STREAM));
    // `None`: an SSE response.
    let long_poll = match query_param(query, "live").as_deref() {
        None if accepts_sse => None,
        None => Some(false),
        Some("long-poll") => Some(true),
        Some("sse") => None,
        Some(other) => return Err(ApiError::bad_request(format!("invalid live mode: {other}"))),
    };
    let Some(long_poll) = long_poll else {
        // Boxed: its setup (a `HEAD` of the stream) is larger than a long-poll's whole
        // read, and inline it sized every parked long-poll's future.
        return Box::pin(sse(core, settings, request, from)).await;
    };
    let read_request = ReadRequest {
        from,
        max_records,
        max_bytes,
        wait_ms: long_poll.then_some(settings.long_poll_timeout_ms),
        with_content_type: format == Format::Raw,
        bound: None,
    };
    let mut batch = core.read(&request.path, &read_request).await?;
    let content_type = batch.content_type.take().unwrap_or_default();
    if long_poll {
        return Ok(long_poll_response(batch, format, content_type, query));
    }
    Ok(catch_up_response(
        &request.path,
        request.header("if-none-match"),
        batch,
        format,
        content_type,
    ))
}

/// Starts an SSE response after checking the stream and the start position.
pub(super) async fn sse(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    request: &Request,
    from: ReadFrom,
) -> Result<Response, ApiError> {
    let info = core.head(&request.path).await?;
    let from = match from {
        ReadFrom::Tail => ReadFrom::Offset(info.next_offset),
        // The engine finds the start (a fork's may lie in its source).
        ReadFrom::AtLeast(_) => from,
        ReadFrom::Offset(offset) if offset < info.start_offset => {
            return Err(ReadError::OffsetGone {
                requested: offset,
                start: info.start_offset,
            }
            .into())
        }
        ReadFrom::Offset(offset) if offset > info.next_offset => {
            return Err(ReadError::OffsetBeyondTail {
                requested: offset,
                tail: info.next_offset,
            }
            .into())
        }
        ReadFrom::Offset(_) => from,
    };
    let events = sse::events(LiveCursor::new(
        core.clone(),
        request.path.clone(),
        from,
        settings.max_chunk_size,
        settings.long_poll_timeout_ms,
        settings.sse_max_duration_ms,
    ));
    Ok(Response::event_stream(events))
}

fn read_headers(mut response: Response, batch: &ReadBatch) -> Response {
    response = response.header(PICO_NEXT_SEQ, batch.next_offset.to_string());
    if batch.up_to_date() {
        response = response.header(PICO_UP_TO_DATE, "true");
    }
    if batch.closed {
        response = response.header(PICO_CLOSED, "true");
    }
    response
}

fn encode_body(batch: &ReadBatch, format: Format, content_type: String) -> (String, Bytes) {
    match format {
        Format::Json => (
            pico_proto::media::JSON.into(),
            codec::encode_json(&batch.records),
        ),
        Format::Binary => (
            codec::BINARY_BATCH_TYPE.into(),
            codec::encode_binary(&batch.records),
        ),
        Format::Raw => (content_type, codec::encode_raw(&batch.records)),
    }
}

fn catch_up_response(
    name: &str,
    if_none_match: Option<&str>,
    batch: ReadBatch,
    format: Format,
    content_type: String,
) -> Response {
    let tag = base64::engine::general_purpose::STANDARD.encode(format!("{name}:{}", format.name()));
    let closed_mark = if batch.closed && batch.records.is_empty() {
        ":c"
    } else {
        ""
    };
    let etag = format!(
        "\"{tag}:{:020}:{:020}{closed_mark}\"",
        batch.from, batch.next_offset
    );
    let (content_type, body) = encode_body(&batch, format, content_type);
    let not_modified = if_none_match == Some(etag.as_str());
    let response = Response::new(if not_modified { 304 } else { 200 })
        .header("content-type", content_type)
        .header("etag", etag)
        .header("cache-control", CATCH_UP_CACHE);
    let response = read_headers(response, &batch);
    if not_modified {
        response
    } else {
        response.with_body(body)
    }
}

/// A cache-busting cursor so successive polls have distinct URLs (the server keeps no state).
fn long_poll_cursor(query: &str) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let interval = now.as_millis() as u64 / 20_000;
    match query_param(query, "cursor").and_then(|c| c.parse::<u64>().ok()) {
        // A cursor near u64::MAX (only a client makes one) stays there: never backwards.
        Some(cursor) if interval <= cursor => cursor
            .saturating_add(1)
            .saturating_add(u64::from(now.subsec_nanos()) % 60),
        _ => interval,
    }
}

fn long_poll_response(
    batch: ReadBatch,
    format: Format,
    content_type: String,
    query: &str,
) -> Response {
    let cursor = long_poll_cursor(query);
    let empty = batch.records.is_empty();
    let mut response = Response::new(if empty { 204 } else { 200 })
        .header(PICO_CURSOR, cursor.to_string())
        .header("cache-control", "no-store");
    if !empty {
        let (content_type, body) = encode_body(&batch, format, content_type);
        response = response
            .header("content-type", content_type)
            .with_body(body);
    }
    read_headers(response, &batch)
}

pub(super) async fn head(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
    let info = core.head(&request.path).await?;
    Ok(head_response(&info))
}

pub(super) fn head_response(info: &StreamInfo) -> Response {
    let mut response = Response::new(200)
        .header(PICO_NEXT_SEQ, info.next_offset.to_string())
        .header(PICO_START_SEQ, info.start_offset.to_string())
        .header("content-type", info.content_type.clone())
        .header("cache-control", "no-store");
    if let Some(ttl) = info.ttl_sec {
        response = response.header(PICO_TTL, ttl.to_string());
    }
    if let Some(at) = info.expires_at_ms {
        response = response.header(PICO_EXPIRES_AT, format_rfc3339_ms(at));
    }
    if info.closed {
        response = response.header(PICO_CLOSED, "true");
    }
    with_retention(response, &info.retention)
}

pub(super) async fn list(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
    let query = request.query.as_str();
    let prefix = query_param(query, "prefix")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".into());
    let start_after = query_param(query, "start_after").unwrap_or_default();
    let limit = match query_param(query, "limit") {
        None => limits::LIST_LIMIT_DEFAULT,
        Some(v) => match strict_u64(&v) {
            Some(0) => limits::LIST_LIMIT_DEFAULT,
            Some(n) => n.min(limits::LIST_LIMIT_MAX as u64) as usize,
            None => return Err(ApiError::bad_request("invalid limit")),
        },
    };
    let (streams, has_more) = core.list_cluster_wide(&prefix, &start_after, limit).await?;
    let mut body = Vec::with_capacity(64 + streams.len() * 128);
    body.extend_from_slice(b"{\"streams\":[");
    for (i, (stream, owner)) in streams.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b"{\"name\":");
        pico_proto::json::string(&mut body, &stream.name);
        body.extend_from_slice(b",\"content_type\":");
        pico_proto::json::string(&mut body, &stream.info.content_type);
        body.extend_from_slice(
            format!(
                ",\"start_seq\":{},\"next_seq\":{},\"closed\":{}",
                stream.info.start_offset, stream.info.next_offset, stream.info.closed
            )
            .as_bytes(),
        );
        if let Some(ttl) = stream.info.ttl_sec {
            body.extend_from_slice(format!(",\"ttl\":{ttl}").as_bytes());
        }
        if let Some(at) = stream.info.expires_at_ms {
            body.extend_from_slice(
                format!(",\"expires_at\":\"{}\"", format_rfc3339_ms(at)).as_bytes(),
            );
        }
        if let Some(owner) = owner {
            body.extend_from_slice(format!(",\"owner_node\":{owner}").as_bytes());
        }
        body.push(b'}');
    }
    body.extend_from_slice(format!("],\"has_more\":{has_more}}}").as_bytes());
    Ok(Response::new(200)
        .header("content-type", pico_proto::media::JSON)
        .header("cache-control", "no-store")
        .with_body(body))
}
