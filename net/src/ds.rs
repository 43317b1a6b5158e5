//! The Durable Streams protocol (`Stream-*` / `Producer-*` headers) on the same engine as the
//! Pico protocol: a stream created through either protocol is readable and writable through
//! both, as both name a stream by its request path.
//!
//! Mapping onto engine records:
//! - a POST body is one record; in JSON mode (`application/json`) a top-level array is
//!   flattened one level and every element is one record (a message);
//! - a read of a JSON stream is `[` + the records joined by `,` + `]`; of any other stream the
//!   records' bodies concatenated.
//!
//! Offsets are opaque to clients and sort lexicographically in stream order:
//!
//! ```text
//! 0000000000000042_0000000000000000
//! └── record seq ─┘ └─ bytes into ─┘   both 16 decimal digits; the second part is
//!                      that record       non-zero only inside a record (a fork point)
//! ```
//!
//! so `0000000000000000_0000000000000000` is the beginning of every stream, `-1` too, and
//! `now` the tail.

use pico_proto::header::*;
use std::rc::Rc;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use pico_engine::health::WAL_RETRY_AFTER_SEC;
use pico_engine::{
    limits, state::ProducerTuple, AppendRequest, CoreHandle, EngineError, Fork, ForkSpec, Op,
    ReadBatch, ReadFrom, ReadRequest, RecordInput, Reply, StreamConfig, StreamInfo,
};

use crate::auth::{bearer, CoreTokens, Denied, Permission};
use crate::ds_subs::Subscriptions;
use crate::message::{BodyStream, Request, Response};
use crate::params::{header_true, producer_tuple, query_values, strict_u64, PartialProducer};
use crate::time::{format_rfc3339_ms, parse_rfc3339_ms};

/// Settings of the Durable Streams handlers.
#[derive(Clone)]
pub struct DsSettings {
    pub long_poll_timeout_ms: u64,
    /// An SSE response ends after this long; the client reconnects from its last offset.
    pub sse_max_duration_ms: u64,
    /// Live reads and SSE events carry at most this per response or event.
    pub max_chunk_size: usize,
    /// A catch-up read answers up to the tail within this (never less than `max_chunk_size`).
    pub catch_up_bytes: usize,
    pub cors_origin: String,
    /// `https` when the listener serves TLS (for absolute URLs in `Location`).
    pub scheme: &'static str,
    pub subscriptions: Arc<Subscriptions>,
    /// The protocol has no retention header: a stream created here gets the node's default
    /// (`--default-retention-*`), and a Pico `PATCH` can change it later.
    pub default_retention: pico_engine::meta::Retention,
}

const ALLOW_METHODS: &str = "GET, POST, PUT, DELETE, HEAD, OPTIONS";
const ALLOW_HEADERS: &str = "content-type, authorization, if-none-match, Stream-TTL, Stream-Expires-At, Stream-Closed, Stream-Seq, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset, Producer-Id, Producer-Epoch, Producer-Seq";
const EXPOSE_HEADERS: &str = "Stream-Next-Offset, Stream-Up-To-Date, Stream-Closed, Stream-Cursor, Stream-TTL, Stream-Expires-At, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, stream-sse-data-encoding, etag, content-type, location";
/// Immutable catch-up chunks (they end before the tail) may be cached.
const CATCH_UP_CACHE: &str = "public, max-age=60, stale-while-revalidate=300";
const JSON_TYPE: &str = pico_proto::media::JSON;
/// Cursor intervals count from this instant (2024-10-09T00:00:00Z), 20 s each: the Durable
/// Streams protocol's fixed epoch and interval, so cursors agree with other servers'.
const CURSOR_EPOCH_MS: u64 = 1_728_432_000_000;
const CURSOR_INTERVAL_MS: u64 = 20_000;
/// Largest integer a producer epoch or sequence may be (JavaScript's safe integers).
const PRODUCER_NUMBER_MAX: u64 = (1 << 53) - 1;

/// A protocol error: status, code, message and extra headers.
#[derive(Debug)]
pub struct DsError {
    status: u16,
    code: &'static str,
    message: String,
    headers: Vec<(&'static str, String)>,
}

impl DsError {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> DsError {
        DsError {
            status,
            code,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    fn bad_request(message: impl Into<String>) -> DsError {
        DsError::new(400, "BAD_REQUEST", message)
    }

    fn with(mut self, name: &'static str, value: impl Into<String>) -> DsError {
        self.headers.push((name, value.into()));
        self
    }
}

/// The one mapping from engine errors to the Durable Streams protocol.
impl From<EngineError> for DsError {
    fn from(error: EngineError) -> DsError {
        let message = error.to_string();
        match error {
            EngineError::NotFound => DsError::new(404, "NOT_FOUND", message),
            EngineError::Gone => DsError::new(410, "GONE", message),
            EngineError::ConfigMismatch { .. } => DsError::new(409, "CONFLICT", message),
            EngineError::SourceGone => DsError::new(409, "CONFLICT", message),
            EngineError::ContentTypeMismatch { .. } => DsError::new(409, "CONFLICT", message),
            EngineError::WriterSeqRegression { .. } => DsError::new(409, "CONFLICT", message),
            EngineError::Closed { next_offset } => DsError::new(409, "STREAM_CLOSED", message)
                .with(STREAM_CLOSED, "true")
                .with(STREAM_NEXT_OFFSET, format_offset(next_offset, 0)),
            EngineError::MatchFailed { actual, .. } => DsError::new(409, "CONFLICT", message)
                .with(STREAM_NEXT_OFFSET, format_offset(actual, 0)),
            EngineError::StaleProducerEpoch { current } => {
                DsError::new(403, "STALE_EPOCH", message).with(PRODUCER_EPOCH, current.to_string())
            }
            EngineError::ProducerSequenceGap { expected, received } => {
                DsError::new(409, "SEQUENCE_GAP", message)
                    .with(PRODUCER_EXPECTED_SEQ, expected.to_string())
                    .with(PRODUCER_RECEIVED_SEQ, received.to_string())
            }
            // The protocol's table: an unknown producer must start at 0, answered like a gap.
            EngineError::UnknownProducer { received } => DsError::new(409, "SEQUENCE_GAP", message)
                .with(PRODUCER_EXPECTED_SEQ, "0")
                .with(PRODUCER_RECEIVED_SEQ, received.to_string()),
            EngineError::OffsetBeyondTail { .. } => DsError::bad_request(message),
            EngineError::OffsetGone { .. } => DsError::new(410, "OFFSET_GONE", message),
            EngineError::Overloaded {
                retry_after_sec, ..
            } => DsError::new(429, "OVERLOADED", message)
                .with("retry-after", retry_after_sec.to_string()),
            EngineError::Invalid(_) => DsError::bad_request(message),
            EngineError::Durability(_) => DsError::new(500, "DURABILITY", message),
            // The metadata log or the bucket failed: nothing was acknowledged; retry.
            EngineError::Storage(_) => {
                DsError::new(503, "UNAVAILABLE", message).with("retry-after", "1")
            }
            EngineError::OutOfSpace(_) => DsError::new(507, "INSUFFICIENT_STORAGE", message)
                .with("retry-after", WAL_RETRY_AFTER_SEC.to_string()),
            EngineError::WritesStopped(_) => DsError::new(503, "UNAVAILABLE", message)
                .with("retry-after", WAL_RETRY_AFTER_SEC.to_string()),
            EngineError::ShuttingDown | EngineError::NotOwner(_) => {
                DsError::new(503, "UNAVAILABLE", message).with("retry-after", "1")
            }
            EngineError::Moved { ref ds_address, .. } if ds_address.is_empty() => DsError::new(
                503,
                "UNAVAILABLE",
                format!("{message}, which serves no Durable Streams listener"),
            )
            .with("retry-after", "1"),
            EngineError::Moved { ds_address, .. } => {
                DsError::new(crate::routing::REDIRECT_STATUS, "MOVED", message)
                    .with("location", ds_address)
            }
        }
    }
}

/// The error body ([`pico_proto::error_body::durable_streams`]).
fn render_error(error: DsError) -> Response {
    let body = pico_proto::error_body::durable_streams(error.code, &error.message);
    let mut response = Response::new(error.status)
        .header("content-type", JSON_TYPE)
        .header("cache-control", "no-store")
        .with_body(body);
    response.headers.extend(error.headers);
    response
}

/// Protocol errors found by the HTTP layer (malformed requests, oversized bodies).
pub fn connection_error(status: u16, message: &str) -> Response {
    let code = match status {
        413 => "PAYLOAD_TOO_LARGE",
        429 => "OVERLOADED",
        431 => "HEADERS_TOO_LARGE",
        _ => "BAD_REQUEST",
    };
    with_common(render_error(DsError::new(status, code, message)), "*")
}

fn with_common(mut response: Response, origin: &str) -> Response {
    response.headers.extend([
        ("x-content-type-options", "nosniff".to_string()),
        ("cross-origin-resource-policy", "cross-origin".to_string()),
        ("access-control-allow-origin", origin.to_string()),
        ("access-control-expose-headers", EXPOSE_HEADERS.to_string()),
    ]);
    response
}

// ------------------------------------------------------------------------- offsets

/// The wire form of a position: record `seq`, `bytes` into it ([`pico_proto::offset`]).
pub use pico_proto::offset::format as format_offset;
use pico_proto::offset::Offset as Position;

/// A parsed `offset` (or `Stream-Fork-Offset`).
fn parse_offset(text: &str) -> Result<Position, DsError> {
    pico_proto::offset::parse(text)
        .ok_or_else(|| DsError::bad_request(format!("invalid offset: {text:?}")))
}

// ------------------------------------------------------------------------- requests

/// Answers one Durable Streams request.
pub async fn handle(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    auth: Option<&CoreTokens>,
    request: Request,
) -> Response {
    if let Some(at) = request.path.find("/__ds/") {
        if request.method != "OPTIONS" {
            // Subscriptions watch many streams: with auth on they need an admin grant, except
            // the webhook callback and the lease calls, which carry their own bearer tokens.
            if let Err(error) = authorize_subscriptions(auth, &request) {
                return with_common(render_error(error), &settings.cors_origin);
            }
            let root = &request.path[..at + 1];
            let rest = &request.path[at + "/__ds/".len()..];
            let base_url = base_url(settings, &request);
            let response = Box::pin(
                settings
                    .subscriptions
                    .handle(core, &base_url, root, rest, &request),
            )
            .await;
            return with_common(response, &settings.cors_origin);
        }
    }
    let result = match authorize(auth, &request) {
        Ok(()) => route(core, settings, &request).await,
        Err(error) => Err(error),
    };
    let mut response = result.unwrap_or_else(render_error);
    crate::routing::complete_redirect(&mut response, &request);
    with_common(response, &settings.cors_origin)
}

fn base_url(settings: &DsSettings, request: &Request) -> String {
    let host = request.header("host").unwrap_or("localhost");
    format!("{}://{host}", settings.scheme)
}

/// With `--auth required` every request but a preflight needs a token
/// granted the operation on the stream.
fn authorize(auth: Option<&CoreTokens>, request: &Request) -> Result<(), DsError> {
    let Some(auth) = auth else { return Ok(()) };
    let Some(permission) = Permission::for_method(&request.method) else {
        return Ok(());
    };
    let token = bearer(request.header("authorization"));
    auth.check(token, permission, &request.path)
        .map_err(|denied| refused(denied, "this token may not do that on this stream"))?;
    // A fork reads its source through the new stream: creating one needs `read` there too.
    if request.method == "PUT" {
        if let Some(source) = request.header(STREAM_FORKED_FROM) {
            auth.check(token, Permission::Read, fork_source_path(source))
                .map_err(|denied| refused(denied, "this token may not read the fork's source"))?;
        }
    }
    Ok(())
}

/// Whether `rest` (the path after `/__ds/`) is one of the control routes the protocol leaves
/// without a stream grant: the signing keys, and the webhook callback and lease calls, which
/// carry the subscription's own bearer token. Exact routes only: any other path under `__ds/`
/// (a subscription that happens to be named `callback`, say) needs the admin grant.
fn is_public_control_route(method: &str, rest: &str) -> bool {
    if rest == "jwks.json" {
        return method == "GET" || method == "HEAD";
    }
    let Some(route) = rest.strip_prefix("subscriptions/") else {
        return false;
    };
    match route.split_once('/') {
        Some((id, action)) => {
            method == "POST" && !id.is_empty() && matches!(action, "callback" | "ack" | "release")
        }
        None => false,
    }
}

fn authorize_subscriptions(auth: Option<&CoreTokens>, request: &Request) -> Result<(), DsError> {
    let Some(auth) = auth else { return Ok(()) };
    let rest = request
        .path
        .find("/__ds/")
        .map_or("", |at| &request.path[at + "/__ds/".len()..]);
    if is_public_control_route(&request.method, rest) {
        return Ok(());
    }
    auth.check(
        bearer(request.header("authorization")),
        Permission::Admin,
        &request.path,
    )
    .map_err(|denied| refused(denied, "subscriptions need an admin token"))
}

/// 401 with `WWW-Authenticate: Bearer` without a valid token, 403 without the grant, as in
/// the Pico protocol (docs/api.md, "Authentication").
fn refused(denied: Denied, forbidden: &str) -> DsError {
    match denied {
        Denied::Unauthenticated => {
            DsError::new(401, "UNAUTHORIZED", "a valid bearer token is required")
                .with("www-authenticate", "Bearer")
        }
        Denied::Forbidden => DsError::new(403, "FORBIDDEN", forbidden),
    }
}

async fn route(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    request: &Request,
) -> Result<Response, DsError> {
    if request.path.len() > limits::STREAM_NAME_LEN_MAX {
        return Err(DsError::bad_request(format!(
            "stream path longer than {} bytes",
            limits::STREAM_NAME_LEN_MAX
        )));
    }
    match request.method.as_str() {
        "OPTIONS" => Ok(Response::new(204)
            .header("access-control-allow-methods", ALLOW_METHODS)
            .header("access-control-allow-headers", ALLOW_HEADERS)
            .header("access-control-max-age", "86400")
            .header("cache-control", "no-store")),
        _ if request.path == "/" => Err(DsError::new(
            405,
            "METHOD_NOT_ALLOWED",
            "the root is not a stream",
        )),
        // Only reads wait (long-polls, SSE: thousands at once), so only a read's future is
        // inline; the others are on the heap while they run, not sizing every read's.
        "PUT" => Box::pin(create(core, settings, request)).await,
        "POST" => Box::pin(append(core, settings, request)).await,
        "GET" => read(core, settings, request).await,
        "HEAD" => Box::pin(head(core, request)).await,
        "DELETE" => Box::pin(delete(core, settings, request)).await,
        _ => Err(DsError::new(
            405,
            "METHOD_NOT_ALLOWED",
            "method not allowed",
        )),
    }
}

fn is_json(content_type: &str) -> bool {
    pico_engine::state::mime_base_eq(content_type, JSON_TYPE)
}

/// The messages of a body: JSON mode flattens a top-level array one level (each element a
/// record, sliced from the body without copying); otherwise the body is one record.
fn body_records(
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
    if !text.starts_with('[') {
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
    Ok(elements
        .into_iter()
        .map(|element| record(slice_of(element.get())))
        .collect())
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

/// The stream a `Stream-Forked-From` names: a path on this server, with or without our scheme
/// and host. Authorization and the engine both use exactly this.
fn fork_source_path(source: &str) -> &str {
    match source.find("://") {
        Some(at) => source[at + 3..]
            .find('/')
            .map_or("/", |slash| &source[at + 3 + slash..]),
        None => source,
    }
}

async fn create(
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
    let wrote = !records.is_empty();
    let op = Op::Create {
        config: StreamConfig {
            content_type,
            ttl_sec,
            expires_at_ms,
            retention: settings.default_retention,
        },
        closed,
        records,
        fork: fork.map(Fork::Spec),
    };
    let Reply::Created { created, info, .. } = core.call(&request.path, op).await? else {
        unreachable!("a create is always answered with Created")
    };
    let next = format_offset(info.next_offset, 0);
    if created && wrote {
        settings
            .subscriptions
            .on_stream_write(core, &request.path, &next);
    }
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

fn producer_headers(request: &Request) -> Result<Option<ProducerTuple>, DsError> {
    let id = request.header(PRODUCER_ID);
    let epoch = producer_number(request, PRODUCER_EPOCH)?;
    let seq = producer_number(request, PRODUCER_SEQ)?;
    producer_tuple(id, epoch, seq).map_err(|PartialProducer| {
        DsError::bad_request("Producer-Id, Producer-Epoch and Producer-Seq must be sent together")
    })
}

async fn append(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    request: &Request,
) -> Result<Response, DsError> {
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
    let op = Op::Append(AppendRequest {
        records,
        close,
        match_offset: None,
        producer,
        content_type,
        writer_seq: request.header(STREAM_SEQ).map(str::to_string),
    });
    let Reply::Appended(ack) = core.call(&request.path, op).await? else {
        unreachable!("an append is always answered with Appended")
    };
    let next = format_offset(ack.next_offset, 0);
    let wrote = ack.start_offset.is_some() || (ack.closed && ack.duplicate_of_seq.is_none());
    if wrote {
        settings
            .subscriptions
            .on_stream_write(core, &request.path, &next);
    }
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

async fn head(core: &Rc<CoreHandle>, request: &Request) -> Result<Response, DsError> {
    let Reply::Head(info) = core.call(&request.path, Op::Head).await? else {
        unreachable!("a head is always answered with Head")
    };
    Ok(head_response(&info))
}

fn head_response(info: &StreamInfo) -> Response {
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

async fn delete(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    request: &Request,
) -> Result<Response, DsError> {
    core.call(&request.path, Op::Delete).await?;
    settings.subscriptions.on_stream_deleted(&request.path);
    Ok(Response::new(204).header("cache-control", "no-store"))
}

// ------------------------------------------------------------------------- reads

#[derive(Clone, Copy, PartialEq, Eq)]
enum Live {
    CatchUp,
    LongPoll,
    Sse,
}

async fn read(
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
        return sse(core, settings, request, from, skip_bytes, cursor).await;
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
    let reply = core.call(&request.path, Op::Read(read_request)).await?;
    let Reply::Read(mut batch) = reply else {
        unreachable!("a read is always answered with Read")
    };
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

/// The body of a read: a JSON array of the messages, or the records' bytes back to back
/// (the first `skip_bytes` of the first record left out: a read from inside a record). The
/// records' stored buffers are used as they are, not joined.
fn encode(batch: &ReadBatch, json: bool, skip_bytes: u64) -> Vec<Bytes> {
    const OPEN: Bytes = Bytes::from_static(b"[");
    const COMMA: Bytes = Bytes::from_static(b",");
    const CLOSE: Bytes = Bytes::from_static(b"]");
    if json {
        let mut parts = Vec::with_capacity(batch.records.len() * 2 + 1);
        parts.push(OPEN);
        for (i, record) in batch.records.iter().enumerate() {
            if i > 0 {
                parts.push(COMMA);
            }
            parts.push(record.body.clone());
        }
        parts.push(CLOSE);
        return parts;
    }
    batch
        .records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if i == 0 && batch.from == r.offset {
                r.body.slice((skip_bytes as usize).min(r.body.len())..)
            } else {
                r.body.clone()
            }
        })
        .collect()
}

/// Joins the parts of a body (an SSE event needs its payload in one piece).
fn joined(parts: Vec<Bytes>) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.into_iter().next().unwrap_or_default(),
        _ => parts.concat().into(),
    }
}

/// The `Stream-Cursor` of a live response: the current 20 s interval, or past the client's
/// cursor by a random jitter when it echoed one at or ahead of that, so cursors never repeat.
fn next_cursor(client: Option<&str>) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let interval = (now.as_millis() as u64).saturating_sub(CURSOR_EPOCH_MS) / CURSOR_INTERVAL_MS;
    match client.and_then(|c| c.parse::<u64>().ok()) {
        Some(cursor) if cursor >= interval => {
            // 1 to 180 intervals (up to an hour) of jitter, from the clock's nanoseconds.
            let jitter = 1 + u64::from(now.subsec_nanos()) % 180;
            // Saturating: a client's cursor near u64::MAX must not wrap to a smaller one.
            cursor.saturating_add(jitter).to_string()
        }
        _ => interval.to_string(),
    }
}

// ------------------------------------------------------------------------- SSE

struct SseState {
    core: Rc<CoreHandle>,
    name: String,
    from: ReadFrom,
    skip_bytes: u64,
    json: bool,
    base64: bool,
    chunk_bytes: usize,
    idle_ms: u64,
    deadline: std::time::Instant,
    cursor: Option<String>,
    done: bool,
    /// The first read: answered without waiting so the client learns the tail at once.
    first: bool,
}

/// Starts an SSE response: `event: data` with the records of each read, each followed by an
/// `event: control` with the offset to resume from (camelCase JSON).
async fn sse(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    request: &Request,
    from: ReadFrom,
    skip_bytes: u64,
    cursor: Option<String>,
) -> Result<Response, DsError> {
    // Checked before the response starts, so a missing stream is a plain 404.
    let Reply::Head(info) = core.call(&request.path, Op::Head).await? else {
        unreachable!("a head is always answered with Head")
    };
    let json = is_json(&info.content_type);
    let text = info
        .content_type
        .trim()
        .to_ascii_lowercase()
        .starts_with("text/");
    let base64 = !json && !text;
    let state = SseState {
        core: core.clone(),
        name: request.path.clone(),
        from,
        skip_bytes,
        json,
        base64,
        chunk_bytes: settings.max_chunk_size,
        idle_ms: settings
            .long_poll_timeout_ms
            .max(crate::sse::KEEP_ALIVE_MIN_MS),
        deadline: std::time::Instant::now()
            + std::time::Duration::from_millis(settings.sse_max_duration_ms),
        cursor,
        done: false,
        first: true,
    };
    let events: BodyStream = Box::pin(futures_lite::stream::unfold(
        state,
        |mut state| async move {
            if state.done {
                return None;
            }
            let events = next_sse_events(&mut state).await;
            Some((events, state))
        },
    ));
    let mut response = Response::new(200)
        .header("content-type", pico_proto::media::EVENT_STREAM)
        .header("cache-control", "no-cache")
        .header("x-accel-buffering", "no");
    if base64 {
        response = response.header(STREAM_SSE_DATA_ENCODING, "base64");
    }
    Ok(response.with_stream(events))
}

/// One read (waiting at the tail) and the events it gives; ends the stream when closed and
/// delivered, deleted, or at the reconnect interval.
async fn next_sse_events(state: &mut SseState) -> Bytes {
    let Some(round) = crate::sse::IdleRound::next(state.deadline, state.idle_ms) else {
        state.done = true;
        return Bytes::new();
    };
    let wait_ms = if state.first { 0 } else { round.wait_ms };
    let first = std::mem::replace(&mut state.first, false);
    let request = ReadRequest {
        from: state.from,
        max_records: limits::RECORDS_PER_READ_MAX,
        max_bytes: state.chunk_bytes,
        wait_ms: Some(wait_ms),
        with_content_type: false,
        bound: None,
    };
    let Some((batch, last)) = crate::sse::live_read(&state.core, &state.name, request).await else {
        state.done = true;
        return Bytes::new();
    };
    state.done |= last;
    if batch.records.is_empty() && !batch.closed && round.last && !first {
        // The wait ran to the deadline: the response ends without another control event.
        state.done = true;
        return Bytes::new();
    }
    let mut out = Vec::new();
    if !batch.records.is_empty() {
        let payload = joined(encode(&batch, state.json, state.skip_bytes));
        out.extend_from_slice(b"event: data\n");
        if state.base64 {
            let encoded = base64::engine::general_purpose::STANDARD.encode(&payload);
            data_lines(&mut out, encoded.as_bytes());
        } else {
            data_lines(&mut out, &payload);
        }
        out.push(b'\n');
    }
    state.skip_bytes = 0;
    state.from = ReadFrom::Offset(batch.next_offset);
    let mut control = serde_json::Map::new();
    control.insert(
        "streamNextOffset".into(),
        format_offset(batch.next_offset, 0).into(),
    );
    if batch.closed {
        control.insert("streamClosed".into(), true.into());
        control.insert("upToDate".into(), true.into());
        state.done = true;
    } else {
        let cursor = next_cursor(state.cursor.as_deref());
        control.insert("streamCursor".into(), cursor.clone().into());
        state.cursor = Some(cursor);
        if batch.up_to_date() {
            control.insert("upToDate".into(), true.into());
        }
    }
    out.extend_from_slice(b"event: control\ndata:");
    out.extend_from_slice(serde_json::Value::Object(control).to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// One `data:` line per line of the payload (CR, LF and CRLF all end a line), so an embedded
/// blank line can never end the event early. A line starting with a space gets `data: `, as
/// event-stream parsers drop one space after the colon.
fn data_lines(out: &mut Vec<u8>, payload: &[u8]) {
    let line = |out: &mut Vec<u8>, text: &[u8]| {
        out.extend_from_slice(if text.first() == Some(&b' ') {
            b"data: "
        } else {
            b"data:"
        });
        out.extend_from_slice(text);
        out.push(b'\n');
    };
    let mut start = 0;
    let mut i = 0;
    while i < payload.len() {
        if matches!(payload[i], b'\r' | b'\n') {
            line(out, &payload[start..i]);
            if payload[i] == b'\r' && payload.get(i + 1) == Some(&b'\n') {
                i += 1;
            }
            start = i + 1;
        }
        i += 1;
    }
    line(out, &payload[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_ds_offset(text in crate::fuzzing::inputs("ds_offset")) {
            let text = String::from_utf8_lossy(&text);
            if let Ok(Position::At { seq, bytes }) = parse_offset(&text) {
                let again = parse_offset(&format_offset(seq, bytes)).ok();
                proptest::prop_assert_eq!(again, Some(Position::At { seq, bytes }));
            }
        }

        #[test]
        fn fuzz_ds_json_body(body in crate::fuzzing::inputs("ds_json_body")) {
            let body = Bytes::from(body);
            if let Ok(records) = body_records(&body, true, true) {
                for record in &records {
                    let parsed = serde_json::from_slice::<serde::de::IgnoredAny>(&record.body);
                    proptest::prop_assert!(parsed.is_ok(), "{:?}", record.body);
                }
            }
        }
    }

    #[test]
    fn offsets_round_trip_and_sort() {
        let a = format_offset(9, 0);
        let b = format_offset(10, 0);
        assert!(a < b, "lexicographic order is stream order");
        assert_eq!(
            parse_offset(&a).ok(),
            Some(Position::At { seq: 9, bytes: 0 })
        );
        assert_eq!(parse_offset("-1").ok(), Some(Position::Start));
        assert_eq!(parse_offset("now").ok(), Some(Position::Now));
        for bad in [
            "", "abc", "1_", "_1", "1 _2", "../1_2", "1,2", "1_2_3", "-2",
        ] {
            assert!(parse_offset(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn json_bodies_flatten_one_level() {
        let count = |text: &str| {
            body_records(&Bytes::from(text.to_string()), true, false).map(|r| {
                r.into_iter()
                    .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(count("[1, {\"a\":2}]").ok().unwrap(), ["1", "{\"a\":2}"]);
        assert_eq!(count("[[1,2],[3]]").ok().unwrap(), ["[1,2]", "[3]"]);
        assert_eq!(count("[[[1]]]").ok().unwrap(), ["[[1]]"]);
        assert_eq!(count(" {\"x\":1} ").ok().unwrap(), ["{\"x\":1}"]);
        assert!(count("[]").is_err());
        assert!(count("{bad").is_err());
        assert!(body_records(&Bytes::from_static(b"[]"), true, true)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn json_arrays_stop_at_the_message_limit() {
        let array = |n: usize| {
            let mut text = vec![b'['];
            for i in 0..n {
                if i > 0 {
                    text.push(b',');
                }
                text.push(b'0');
            }
            text.push(b']');
            Bytes::from(text)
        };
        let limit = limits::RECORDS_PER_APPEND_MAX;
        assert_eq!(
            body_records(&array(limit), true, false).ok().unwrap().len(),
            limit
        );
        let refused = body_records(&array(limit + 1), true, false).err().unwrap();
        assert_eq!(refused.status, 400);
        assert!(
            refused.message.contains("at most 100000 messages"),
            "{}",
            refused.message
        );
        let broken = body_records(&Bytes::from_static(b"[0,0,"), true, false)
            .err()
            .unwrap();
        assert!(
            broken.message.starts_with("invalid JSON"),
            "{}",
            broken.message
        );
    }

    #[test]
    fn sse_data_lines_split_every_line_ending() {
        let mut out = Vec::new();
        data_lines(&mut out, b"a\r\nb\rc\n\n d");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "data:a\ndata:b\ndata:c\ndata:\ndata:  d\n"
        );
    }

    #[test]
    fn cursors_move_past_an_echoed_one() {
        let current: u64 = next_cursor(None).parse().unwrap();
        let echoed = current.to_string();
        let next: u64 = next_cursor(Some(&echoed)).parse().unwrap();
        assert!(next > current);
        assert_eq!(next_cursor(Some("1")), current.to_string());
    }

    #[test]
    fn queries_keep_every_value() {
        assert_eq!(query_values("offset=1&offset=2", "offset"), ["1", "2"]);
        assert_eq!(query_values("a=%2F&b", "a"), ["/"]);
        assert!(query_values("x=1", "offset").is_empty());
    }
}
