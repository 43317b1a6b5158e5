//! The Pico protocol: methods and paths to engine operations, engine errors to status codes.
//!
//! The stream name is the request path exactly as received (not percent-decoded); `/` is
//! reserved for the listing. See `docs/api.md` for the user-facing description.

use pico_proto::header::*;
use std::rc::Rc;

use base64::Engine as _;
use bytes::Bytes;
use pico_engine::health::WAL_RETRY_AFTER_SEC;
use pico_engine::meta::Retention;
use pico_engine::{
    limits, state::ProducerTuple, AppendRequest, CoreHandle, EngineError, Op, ReadBatch, ReadFrom,
    ReadRequest, RecordInput, Reply, RetentionChange, StreamConfig, StreamInfo,
};

use crate::auth::{bearer, CoreTokens, Denied, Permission};
use crate::codec;
use crate::message::{Request, Response};
use crate::params::{header_true, producer_tuple, PartialProducer};
pub use crate::params::{query_param, strict_u64};
use crate::sse;
use crate::time::{format_rfc3339_ms, parse_rfc3339_ms};

/// Settings of the Pico handlers.
#[derive(Clone)]
pub struct PicoSettings {
    pub long_poll_timeout_ms: u64,
    pub max_chunk_size: usize,
    pub sse_max_duration_ms: u64,
    pub cors_origin: String,
    /// `--auth required`: the token table shared by the cores.
    pub auth: Option<std::sync::Arc<crate::auth::SharedTokens>>,
    /// Durable Streams subscriptions watch the same streams: Pico writes wake them too.
    pub subscriptions: std::sync::Arc<crate::ds_subs::Subscriptions>,
    /// `--default-retention-*`: each limit a create does not set.
    pub default_retention: Retention,
}

const ALLOW_METHODS: &str = "GET, PUT, POST, PATCH, DELETE, HEAD, OPTIONS";
const ALLOW_HEADERS: &str = "content-type, authorization, if-none-match, last-event-id, Pico-Match-Seq, Pico-Trim-Seq, Pico-TTL, Pico-Expires-At, Pico-Closed, Pico-Producer-Id, Pico-Producer-Epoch, Pico-Producer-Seq, Pico-Retention-Age, Pico-Retention-Bytes, Pico-Delete-On-Empty";
const EXPOSE_HEADERS: &str = "Pico-Start-Seq, Pico-Next-Seq, Pico-Timestamp, Pico-Cursor, Pico-Up-To-Date, Pico-Closed, Pico-Producer-Epoch, Pico-Producer-Seq, Pico-Expected-Seq, Pico-Received-Seq, Pico-TTL, Pico-Expires-At, Pico-Retention-Age, Pico-Retention-Bytes, Pico-Delete-On-Empty, etag, content-type, location";
const CATCH_UP_CACHE: &str = "public, max-age=60, stale-while-revalidate=300";

/// A protocol error: status, `error` code, message and the tail when known.
pub struct ApiError {
    status: u16,
    code: &'static str,
    message: String,
    next_seq: Option<u64>,
    extra: Vec<(&'static str, String)>,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            code: "bad_request",
            message: message.into(),
            next_seq: None,
            extra: Vec::new(),
        }
    }

    fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            next_seq: None,
            extra: Vec::new(),
        }
    }
}

/// The one mapping from engine errors to the Pico protocol.
impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> ApiError {
        let message = error.to_string();
        match error {
            EngineError::NotFound => ApiError::new(404, "not_found", message),
            EngineError::ConfigMismatch { next_offset, .. } => ApiError {
                next_seq: Some(next_offset),
                ..ApiError::new(409, "conflict", message)
            },
            EngineError::Closed { next_offset } => ApiError {
                next_seq: Some(next_offset),
                extra: vec![(PICO_CLOSED, "true".into())],
                ..ApiError::new(409, "closed", message)
            },
            EngineError::Gone => ApiError::new(410, "gone", message),
            EngineError::SourceGone
            | EngineError::ContentTypeMismatch { .. }
            | EngineError::WriterSeqRegression { .. } => ApiError::new(409, "conflict", message),
            EngineError::MatchFailed { actual, .. } => ApiError {
                next_seq: Some(actual),
                ..ApiError::new(412, "match_failed", message)
            },
            EngineError::StaleProducerEpoch { current } => ApiError {
                extra: vec![(PICO_PRODUCER_EPOCH, current.to_string())],
                ..ApiError::new(403, "fenced", message)
            },
            EngineError::ProducerSequenceGap { expected, received } => ApiError {
                extra: vec![
                    (PICO_EXPECTED_SEQ, expected.to_string()),
                    (PICO_RECEIVED_SEQ, received.to_string()),
                ],
                ..ApiError::new(409, "sequence_gap", message)
            },
            EngineError::OffsetBeyondTail { .. } => ApiError::bad_request(message),
            EngineError::OffsetGone { start, .. } => ApiError {
                next_seq: Some(start),
                ..ApiError::new(410, "offset_gone", message)
            },
            EngineError::Overloaded {
                retry_after_sec, ..
            } => ApiError {
                extra: vec![("retry-after", retry_after_sec.to_string())],
                ..ApiError::new(429, "overloaded", message)
            },
            EngineError::Invalid(_) | EngineError::UnknownProducer { .. } => {
                ApiError::bad_request(message)
            }
            EngineError::Durability(_) => ApiError::new(500, "durability", message),
            // The metadata log or the bucket failed: nothing was acknowledged; retry.
            EngineError::Storage(_) => ApiError {
                extra: vec![("retry-after", "1".into())],
                ..ApiError::new(503, "unavailable", message)
            },
            EngineError::OutOfSpace(_) => ApiError {
                extra: vec![("retry-after", WAL_RETRY_AFTER_SEC.to_string())],
                ..ApiError::new(507, "insufficient_storage", message)
            },
            EngineError::WritesStopped(_) => ApiError {
                extra: vec![("retry-after", WAL_RETRY_AFTER_SEC.to_string())],
                ..ApiError::new(503, "unavailable", message)
            },
            EngineError::ShuttingDown | EngineError::NotOwner(_) => ApiError {
                extra: vec![("retry-after", "1".into())],
                ..ApiError::new(503, "unavailable", message)
            },
            EngineError::Moved { ref address, .. } if address.is_empty() => ApiError::new(
                503,
                "unavailable",
                format!("{message}, which serves no Pico listener"),
            ),
            EngineError::Moved { address, .. } => ApiError {
                extra: vec![("location", address)],
                ..ApiError::new(crate::routing::REDIRECT_STATUS, "moved", message)
            },
        }
    }
}

/// The JSON error body ([`pico_proto::error_body::pico`]).
pub fn error_response(status: u16, code: &str, message: &str, next_seq: Option<u64>) -> Response {
    let body = pico_proto::error_body::pico(code, message, next_seq);
    let mut response = Response::new(status)
        .header("content-type", pico_proto::media::JSON)
        .header("cache-control", "no-store")
        .with_body(body);
    if let Some(next) = next_seq {
        response = response.header(PICO_NEXT_SEQ, next.to_string());
    }
    response
}

fn render_error(error: ApiError) -> Response {
    let mut response = error_response(error.status, error.code, &error.message, error.next_seq);
    response.headers.extend(error.extra);
    response
}

/// Protocol errors found by the HTTP layer (malformed requests, oversized bodies).
pub fn connection_error(status: u16, message: &str) -> Response {
    let code = match status {
        413 => "too_large",
        429 => "overloaded",
        501 => "not_implemented",
        _ => "bad_request",
    };
    with_common(error_response(status, code, message, None), "*")
}

fn with_common(mut response: Response, origin: &str) -> Response {
    response
        .headers
        .push(("x-content-type-options", "nosniff".into()));
    response
        .headers
        .push(("cross-origin-resource-policy", "same-origin".into()));
    response
        .headers
        .push(("access-control-allow-origin", origin.into()));
    response
        .headers
        .push(("access-control-expose-headers", EXPOSE_HEADERS.into()));
    response
}

/// Answers one Pico request.
pub async fn handle(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    auth: Option<&CoreTokens>,
    request: Request,
) -> Response {
    let result = match authorize(auth, &request) {
        Ok(()) => route(core, settings, &request).await,
        Err(error) => Err(error),
    };
    if let Ok(response) = &result {
        notify_subscriptions(core, settings, &request, response);
    }
    let mut response = result.unwrap_or_else(render_error);
    crate::routing::complete_redirect(&mut response, &request);
    with_common(response, &settings.cors_origin)
}

/// Wakes Durable Streams subscriptions watching a stream this request wrote or deleted.
fn notify_subscriptions(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    request: &Request,
    response: &Response,
) {
    // Most nodes have no subscription at all: skip the header scan and the offset formatting.
    if settings.subscriptions.is_empty() {
        return;
    }
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    };
    match request.method.as_str() {
        "DELETE" if response.status == 204 => {
            settings.subscriptions.on_stream_deleted(&request.path)
        }
        "PUT" | "POST" if header(PICO_START_SEQ).is_some() || header(PICO_CLOSED).is_some() => {
            if let Some(next) = header(PICO_NEXT_SEQ).and_then(|n| n.parse().ok()) {
                let tail = crate::ds::format_offset(next, 0);
                settings
                    .subscriptions
                    .on_stream_write(core, &request.path, &tail);
            }
        }
        _ => {}
    }
}

/// With `--auth required`, every request but a CORS preflight needs a bearer token
/// granted the operation on the stream (for a listing, on the listed prefix).
fn authorize(auth: Option<&CoreTokens>, request: &Request) -> Result<(), ApiError> {
    let Some(auth) = auth else { return Ok(()) };
    let Some(permission) = Permission::for_method(&request.method) else {
        return Ok(());
    };
    let name = if request.path == "/" {
        query_param(&request.query, "prefix")
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into())
    } else {
        request.path.clone()
    };
    match auth.check(bearer(request.header("authorization")), permission, &name) {
        Ok(()) => Ok(()),
        Err(Denied::Unauthenticated) => Err(ApiError {
            extra: vec![("www-authenticate", "Bearer".into())],
            ..ApiError::new(401, "unauthorized", "a valid bearer token is required")
        }),
        Err(Denied::Forbidden) => Err(ApiError::new(
            403,
            "forbidden",
            "this token may not do that on this stream",
        )),
    }
}

async fn route(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    request: &Request,
) -> Result<Response, ApiError> {
    let path = request.path.as_str();
    if path.len() > limits::STREAM_NAME_LEN_MAX {
        return Err(ApiError::bad_request(format!(
            "stream name longer than {} bytes",
            limits::STREAM_NAME_LEN_MAX
        )));
    }
    let root = path == "/";
    match request.method.as_str() {
        "OPTIONS" => Ok(Response::new(204)
            .header("access-control-allow-methods", ALLOW_METHODS)
            .header("access-control-allow-headers", ALLOW_HEADERS)
            .header("access-control-max-age", "86400")
            .header("cache-control", "no-store")),
        "GET" if root => Box::pin(list(core, request)).await,
        "PUT" if root => Err(ApiError::bad_request("cannot create the root stream")),
        "POST" if root => Err(ApiError::bad_request("no stream in path")),
        "HEAD" | "DELETE" | "PATCH" if root => Err(ApiError::new(
            405,
            "method_not_allowed",
            "method not allowed on /",
        )),
        // Only reads wait (long-polls, SSE: thousands at once), so only a read's future is
        // inline; the others are on the heap while they run, not sizing every read's.
        "PUT" => Box::pin(create(core, settings, request)).await,
        "POST" => Box::pin(append(core, request)).await,
        "GET" => read(core, settings, request).await,
        "HEAD" => Box::pin(head(core, request)).await,
        "DELETE" => Box::pin(delete(core, request)).await,
        "PATCH" => Box::pin(configure(core, request)).await,
        _ => Err(ApiError::new(
            405,
            "method_not_allowed",
            "method not allowed",
        )),
    }
}

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
    let limit = |name: &str, display: &str, policy: Policy| {
        header_u64(request, name, display)?
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
            limits::retention_secs,
        )?,
        bytes: limit(
            PICO_RETENTION_BYTES,
            "Pico-Retention-Bytes",
            limits::retention_bytes,
        )?,
        delete_on_empty_ms: limit(
            PICO_DELETE_ON_EMPTY,
            "Pico-Delete-On-Empty",
            limits::retention_secs,
        )?,
    })
}

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

/// `PATCH /stream` with retention headers: replaces the limits it names, keeps the others.
async fn configure(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
    let change = retention_headers(request)?;
    let Reply::Configured(info) = core.call(&request.path, Op::Configure { change }).await? else {
        unreachable!("a configure is always answered with Configured")
    };
    Ok(head_response(&info))
}

async fn create(
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
    let reply = core
        .call(
            &request.path,
            Op::Create {
                config,
                closed,
                records,
                fork: None,
            },
        )
        .await?;
    let Reply::Created { created, info, .. } = reply else {
        unreachable!("a create is always answered with Created")
    };
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

async fn append(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
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
        let content_type = request.header("content-type").unwrap_or("");
        let base = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match base.as_str() {
            codec::BINARY_BATCH_TYPE => {
                codec::decode_binary_batch(&request.body, limits::RECORDS_PER_APPEND_MAX)
                    .map_err(ApiError::bad_request)?
            }
            codec::JSON_BATCH_TYPE => {
                codec::decode_json_batch(&request.body, limits::RECORDS_PER_APPEND_MAX)
                    .map_err(ApiError::bad_request)?
            }
            _ => vec![RecordInput {
                headers: Vec::new(),
                body: request.body.clone(),
            }],
        }
    };
    if records.is_empty() && !close {
        return Err(ApiError::bad_request("empty body"));
    }
    let echo = producer.as_ref().map(|p| (p.epoch, p.seq));
    let op = Op::Append(AppendRequest {
        records,
        close,
        match_offset,
        producer,
        content_type: None,
        writer_seq: None,
    });
    let Reply::Appended(ack) = core.call(&request.path, op).await? else {
        unreachable!("an append is always answered with Appended")
    };
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
fn producer_headers(request: &Request) -> Result<Option<ProducerTuple>, ApiError> {
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
async fn trim(core: &Rc<CoreHandle>, request: &Request, offset: u64) -> Result<Response, ApiError> {
    if !request.body.is_empty() {
        return Err(ApiError::bad_request("trim takes no body"));
    }
    let Reply::Trimmed { start_offset } = core.call(&request.path, Op::Trim { offset }).await?
    else {
        unreachable!("a trim is always answered with Trimmed")
    };
    Ok(Response::new(200)
        .header(PICO_START_SEQ, start_offset.to_string())
        .header("cache-control", "no-store"))
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

async fn read(
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
    let long_poll = match query_param(query, "live").as_deref() {
        None if accepts_sse => return sse(core, settings, request, from).await,
        None => false,
        Some("long-poll") => true,
        Some("sse") => return sse(core, settings, request, from).await,
        Some(other) => return Err(ApiError::bad_request(format!("invalid live mode: {other}"))),
    };
    let read_request = ReadRequest {
        from,
        max_records,
        max_bytes,
        wait_ms: long_poll.then_some(settings.long_poll_timeout_ms),
        with_content_type: format == Format::Raw,
        bound: None,
    };
    let reply = core.call(&request.path, Op::Read(read_request)).await?;
    let Reply::Read(mut batch) = reply else {
        unreachable!("a read is always answered with Read")
    };
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
async fn sse(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    request: &Request,
    from: ReadFrom,
) -> Result<Response, ApiError> {
    let Reply::Head(info) = core.call(&request.path, Op::Head).await? else {
        unreachable!("a head is always answered with Head")
    };
    let from = match from {
        ReadFrom::Tail => ReadFrom::Offset(info.next_offset),
        // The engine finds the start (a fork's may lie in its source).
        ReadFrom::AtLeast(_) => from,
        ReadFrom::Offset(offset) if offset < info.start_offset => {
            return Err(EngineError::OffsetGone {
                requested: offset,
                start: info.start_offset,
            }
            .into())
        }
        ReadFrom::Offset(offset) if offset > info.next_offset => {
            return Err(EngineError::OffsetBeyondTail {
                requested: offset,
                tail: info.next_offset,
            }
            .into())
        }
        ReadFrom::Offset(_) => from,
    };
    let events = sse::events(
        core.clone(),
        request.path.clone(),
        from,
        settings.max_chunk_size,
        settings.long_poll_timeout_ms,
        settings.sse_max_duration_ms,
    );
    Ok(Response::new(200)
        .header("content-type", pico_proto::media::EVENT_STREAM)
        .header("cache-control", "no-cache")
        .header("x-accel-buffering", "no")
        .with_stream(events))
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

async fn head(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
    let Reply::Head(info) = core.call(&request.path, Op::Head).await? else {
        unreachable!("a head is always answered with Head")
    };
    Ok(head_response(&info))
}

fn head_response(info: &StreamInfo) -> Response {
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

async fn delete(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
    core.call(&request.path, Op::Delete).await?;
    Ok(Response::new(204).header("cache-control", "no-store"))
}

async fn list(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, ApiError> {
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
    let (streams, has_more) = core.list(&prefix, &start_after, limit).await?;
    let mut body = Vec::with_capacity(64 + streams.len() * 128);
    body.extend_from_slice(b"{\"streams\":[");
    for (i, stream) in streams.iter().enumerate() {
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
        body.push(b'}');
    }
    body.extend_from_slice(format!("],\"has_more\":{has_more}}}").as_bytes());
    Ok(Response::new(200)
        .header("content-type", pico_proto::media::JSON)
        .header("cache-control", "no-store")
        .with_body(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_integers() {
        assert_eq!(strict_u64("0"), Some(0));
        assert_eq!(strict_u64("42"), Some(42));
        for bad in ["", "01", "+1", "-1", "1.0", "18446744073709551616", " 1"] {
            assert_eq!(strict_u64(bad), None, "{bad}");
        }
    }

    #[test]
    fn query_parsing() {
        assert_eq!(query_param("a=1&a=2", "a").as_deref(), Some("1"));
        assert_eq!(
            query_param("prefix=%2Flogs+x", "prefix").as_deref(),
            Some("/logs x")
        );
        assert_eq!(query_param("p=%zz", "p").as_deref(), Some("%zz"));
        assert_eq!(query_param("p=%", "p").as_deref(), Some("%"));
        assert_eq!(query_param("x", "x").as_deref(), Some(""));
        assert_eq!(query_param("", "x"), None);
    }
}
