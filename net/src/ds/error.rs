//! The Durable Streams protocol's answers that are not a success: the one mapping from
//! engine errors to status codes and codes in the body, refusals of the bearer token, and the
//! headers every answer carries.

use pico_engine::health::WAL_RETRY_AFTER_SEC;
use pico_engine::{AppendError, CreateError, EngineError, ReadError, TrimError};
use pico_proto::header::*;
use pico_proto::offset::format as format_offset;

use crate::auth::Denied;
use crate::transport::message::{allow_origin, HeaderValue, Response};

pub(super) const EXPOSE_HEADERS: &str = "Stream-Next-Offset, Stream-Up-To-Date, Stream-Closed, Stream-Cursor, Stream-TTL, Stream-Expires-At, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, stream-sse-data-encoding, etag, content-type, location";

/// A protocol error: status, code, message and extra headers.
#[derive(Debug)]
pub struct DsError {
    pub(super) status: u16,
    pub(super) code: &'static str,
    pub(super) message: String,
    pub(super) headers: Vec<(&'static str, HeaderValue)>,
}

impl DsError {
    pub(super) fn new(status: u16, code: &'static str, message: impl Into<String>) -> DsError {
        DsError {
            status,
            code,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> DsError {
        DsError::new(400, "BAD_REQUEST", message)
    }

    pub(super) fn with(mut self, name: &'static str, value: impl Into<HeaderValue>) -> DsError {
        self.headers.push((name, value.into()));
        self
    }
}

/// The mapping from the errors any operation can meet to the Durable Streams protocol; each
/// operation's own errors below add theirs.
impl From<EngineError> for DsError {
    fn from(error: EngineError) -> DsError {
        let message = error.to_string();
        match error {
            EngineError::NotFound => DsError::new(404, "NOT_FOUND", message),
            EngineError::Gone => DsError::new(410, "GONE", message),
            EngineError::Overloaded {
                retry_after_sec, ..
            } => DsError::new(429, "OVERLOADED", message)
                .with("retry-after", retry_after_sec.to_string()),
            // The stored bytes are damaged: asking again reads them again (the node's log
            // and `pico_damaged_reads_total` tell the operator).
            EngineError::Storage(ref fault) if fault.is_damage() => {
                DsError::new(500, "DAMAGED", message)
            }
            // The metadata log's disk is full: answered as a full WAL disk is.
            EngineError::Storage(ref fault) if fault.is_out_of_space() => {
                DsError::new(507, "INSUFFICIENT_STORAGE", message)
                    .with("retry-after", WAL_RETRY_AFTER_SEC.to_string())
            }
            // The metadata log or the bucket failed: nothing was acknowledged; retry.
            EngineError::Storage(_) => {
                DsError::new(503, "UNAVAILABLE", message).with("retry-after", "1")
            }
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

impl From<AppendError> for DsError {
    fn from(error: AppendError) -> DsError {
        let message = error.to_string();
        match error {
            AppendError::Engine(e) => e.into(),
            AppendError::ContentTypeMismatch { .. } => DsError::new(409, "CONFLICT", message),
            AppendError::WriterSeqRegression { .. } => DsError::new(409, "CONFLICT", message),
            AppendError::Closed { next_offset } => DsError::new(409, "STREAM_CLOSED", message)
                .with(STREAM_CLOSED, "true")
                .with(STREAM_NEXT_OFFSET, format_offset(next_offset, 0)),
            AppendError::MatchFailed { actual, .. } => DsError::new(409, "CONFLICT", message)
                .with(STREAM_NEXT_OFFSET, format_offset(actual, 0)),
            AppendError::StaleProducerEpoch { current } => {
                DsError::new(403, "STALE_EPOCH", message).with(PRODUCER_EPOCH, current.to_string())
            }
            AppendError::ProducerSequenceGap { expected, received } => {
                DsError::new(409, "SEQUENCE_GAP", message)
                    .with(PRODUCER_EXPECTED_SEQ, expected.to_string())
                    .with(PRODUCER_RECEIVED_SEQ, received.to_string())
            }
            // The protocol's table: an unknown producer must start at 0, answered like a gap.
            AppendError::UnknownProducer { received } => DsError::new(409, "SEQUENCE_GAP", message)
                .with(PRODUCER_EXPECTED_SEQ, "0")
                .with(PRODUCER_RECEIVED_SEQ, received.to_string()),
            AppendError::TooManyProducers { .. } => {
                DsError::new(429, "TOO_MANY_PRODUCERS", message)
            }
            AppendError::Invalid(_) => DsError::bad_request(message),
            AppendError::Durability { .. } => DsError::new(500, "DURABILITY", message),
            AppendError::OutOfSpace { .. } => DsError::new(507, "INSUFFICIENT_STORAGE", message)
                .with("retry-after", WAL_RETRY_AFTER_SEC.to_string()),
            AppendError::WritesStopped { .. } => DsError::new(503, "UNAVAILABLE", message)
                .with("retry-after", WAL_RETRY_AFTER_SEC.to_string()),
        }
    }
}

impl From<ReadError> for DsError {
    fn from(error: ReadError) -> DsError {
        let message = error.to_string();
        match error {
            ReadError::Engine(e) => e.into(),
            ReadError::OffsetBeyondTail { .. } => DsError::bad_request(message),
            ReadError::OffsetGone { .. } => DsError::new(410, "OFFSET_GONE", message),
        }
    }
}

impl From<CreateError> for DsError {
    fn from(error: CreateError) -> DsError {
        let message = error.to_string();
        match error {
            CreateError::Engine(e) => e.into(),
            CreateError::ConfigMismatch { .. } | CreateError::SourceGone => {
                DsError::new(409, "CONFLICT", message)
            }
            CreateError::Invalid(_) => DsError::bad_request(message),
            CreateError::Append(e) => e.into(),
            CreateError::ForkPoint(e) => e.into(),
        }
    }
}

impl From<TrimError> for DsError {
    fn from(error: TrimError) -> DsError {
        let message = error.to_string();
        match error {
            TrimError::Engine(e) => e.into(),
            TrimError::ReadByForks { .. } => DsError::new(409, "CONFLICT", message),
        }
    }
}

/// The error body ([`pico_proto::error_body::durable_streams`]).
pub(super) fn render_error(error: DsError) -> Response {
    let body = pico_proto::error_body::durable_streams(error.code, &error.message);
    let mut response = Response::new(error.status)
        .header("content-type", pico_proto::media::JSON)
        .header("cache-control", "no-store")
        .with_body(body);
    response.headers.extend(error.headers);
    response
}

/// Protocol errors found by the HTTP layer (malformed requests, oversized bodies).
/// Counted in `pico_http_responses_total` here: no handler's answer passes `respond` for these.
pub fn connection_error(status: u16, message: &str) -> Response {
    crate::admin::metrics::count_connection_error(crate::config::Protocol::DurableStreams, status);
    let code = match status {
        413 => "PAYLOAD_TOO_LARGE",
        417 => "EXPECTATION_FAILED",
        429 => "OVERLOADED",
        431 => "HEADERS_TOO_LARGE",
        503 => "UNAVAILABLE",
        _ => "BAD_REQUEST",
    };
    with_common(render_error(DsError::new(status, code, message)), "*")
}

pub(super) fn with_common(mut response: Response, origin: &str) -> Response {
    response.headers.extend([
        ("x-content-type-options", "nosniff".into()),
        ("cross-origin-resource-policy", "cross-origin".into()),
        ("access-control-allow-origin", allow_origin(origin)),
        ("access-control-expose-headers", EXPOSE_HEADERS.into()),
    ]);
    response
}

/// 401 with `WWW-Authenticate: Bearer` without a valid token, 403 without the grant, as in
/// the Pico protocol (docs/api.md, "Authentication").
pub(super) fn refused(denied: Denied, forbidden: &str) -> DsError {
    match denied {
        Denied::Unauthenticated => {
            DsError::new(401, "UNAUTHORIZED", "a valid bearer token is required")
                .with("www-authenticate", "Bearer")
        }
        Denied::Forbidden => DsError::new(403, "FORBIDDEN", forbidden),
    }
}
