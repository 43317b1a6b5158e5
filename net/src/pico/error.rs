//! The Pico protocol's answers that are not a success: the one mapping from engine errors to
//! status codes and JSON bodies (docs/api.md, "Errors"), and the headers every answer carries.

use pico_engine::health::WAL_RETRY_AFTER_SEC;
use pico_engine::{AppendError, CreateError, EngineError, ReadError, TrimError};
use pico_proto::header::*;

use crate::transport::message::{allow_origin, HeaderValue, Response};

pub(super) const EXPOSE_HEADERS: &str = "Pico-Start-Seq, Pico-Next-Seq, Pico-Timestamp, Pico-Cursor, Pico-Up-To-Date, Pico-Closed, Pico-Producer-Epoch, Pico-Producer-Seq, Pico-Expected-Seq, Pico-Received-Seq, Pico-TTL, Pico-Expires-At, Pico-Retention-Age, Pico-Retention-Bytes, Pico-Delete-On-Empty, etag, content-type, location";

/// A protocol error: status, `error` code, message and the tail when known.
pub struct ApiError {
    pub(super) status: u16,
    pub(super) code: &'static str,
    pub(super) message: String,
    pub(super) next_seq: Option<u64>,
    pub(super) extra: Vec<(&'static str, HeaderValue)>,
}

impl ApiError {
    pub(super) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            code: "bad_request",
            message: message.into(),
            next_seq: None,
            extra: Vec::new(),
        }
    }

    pub(super) fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            next_seq: None,
            extra: Vec::new(),
        }
    }
}

/// The mapping from the errors any operation can meet to the Pico protocol; each
/// operation's own errors below add theirs.
impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> ApiError {
        let message = error.to_string();
        match error {
            EngineError::NotFound => ApiError::new(404, "not_found", message),
            EngineError::Gone => ApiError::new(410, "gone", message),
            EngineError::Overloaded {
                retry_after_sec, ..
            } => ApiError {
                extra: vec![("retry-after", retry_after_sec.to_string().into())],
                ..ApiError::new(429, "overloaded", message)
            },
            // The stored bytes are damaged: asking again reads them again (the node's log
            // and `pico_damaged_reads_total` tell the operator).
            EngineError::Storage(ref fault) if fault.is_damage() => {
                ApiError::new(500, "damaged", message)
            }
            // The metadata log's disk is full: answered as a full WAL disk is.
            EngineError::Storage(ref fault) if fault.is_out_of_space() => ApiError {
                extra: vec![("retry-after", WAL_RETRY_AFTER_SEC.to_string().into())],
                ..ApiError::new(507, "insufficient_storage", message)
            },
            // The metadata log or the bucket failed: nothing was acknowledged; retry.
            EngineError::Storage(_) => ApiError {
                extra: vec![("retry-after", "1".into())],
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
                extra: vec![("location", address.into())],
                ..ApiError::new(crate::routing::REDIRECT_STATUS, "moved", message)
            },
        }
    }
}

impl From<AppendError> for ApiError {
    fn from(error: AppendError) -> ApiError {
        let message = error.to_string();
        match error {
            AppendError::Engine(e) => e.into(),
            AppendError::Closed { next_offset } => ApiError {
                next_seq: Some(next_offset),
                extra: vec![(PICO_CLOSED, "true".into())],
                ..ApiError::new(409, "closed", message)
            },
            AppendError::ContentTypeMismatch { .. } | AppendError::WriterSeqRegression { .. } => {
                ApiError::new(409, "conflict", message)
            }
            AppendError::MatchFailed { actual, .. } => ApiError {
                next_seq: Some(actual),
                ..ApiError::new(412, "match_failed", message)
            },
            AppendError::StaleProducerEpoch { current } => ApiError {
                extra: vec![(PICO_PRODUCER_EPOCH, current.to_string().into())],
                ..ApiError::new(403, "fenced", message)
            },
            AppendError::ProducerSequenceGap { expected, received } => ApiError {
                extra: vec![
                    (PICO_EXPECTED_SEQ, expected.to_string().into()),
                    (PICO_RECEIVED_SEQ, received.to_string().into()),
                ],
                ..ApiError::new(409, "sequence_gap", message)
            },
            AppendError::TooManyProducers { .. } => {
                ApiError::new(429, "too_many_producers", message)
            }
            AppendError::Invalid(_) | AppendError::UnknownProducer { .. } => {
                ApiError::bad_request(message)
            }
            AppendError::Durability { .. } => ApiError::new(500, "durability", message),
            AppendError::OutOfSpace { .. } => ApiError {
                extra: vec![("retry-after", WAL_RETRY_AFTER_SEC.to_string().into())],
                ..ApiError::new(507, "insufficient_storage", message)
            },
            AppendError::WritesStopped { .. } => ApiError {
                extra: vec![("retry-after", WAL_RETRY_AFTER_SEC.to_string().into())],
                ..ApiError::new(503, "unavailable", message)
            },
        }
    }
}

impl From<ReadError> for ApiError {
    fn from(error: ReadError) -> ApiError {
        let message = error.to_string();
        match error {
            ReadError::Engine(e) => e.into(),
            ReadError::OffsetBeyondTail { .. } => ApiError::bad_request(message),
            ReadError::OffsetGone { start, .. } => ApiError {
                next_seq: Some(start),
                ..ApiError::new(410, "offset_gone", message)
            },
        }
    }
}

impl From<CreateError> for ApiError {
    fn from(error: CreateError) -> ApiError {
        let message = error.to_string();
        match error {
            CreateError::Engine(e) => e.into(),
            CreateError::ConfigMismatch { next_offset, .. } => ApiError {
                next_seq: Some(next_offset),
                ..ApiError::new(409, "conflict", message)
            },
            CreateError::SourceGone => ApiError::new(409, "conflict", message),
            CreateError::Invalid(_) => ApiError::bad_request(message),
            CreateError::Append(e) => e.into(),
            CreateError::ForkPoint(e) => e.into(),
        }
    }
}

impl From<TrimError> for ApiError {
    fn from(error: TrimError) -> ApiError {
        let message = error.to_string();
        match error {
            TrimError::Engine(e) => e.into(),
            TrimError::ReadByForks { .. } => ApiError::new(409, "conflict", message),
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

pub(super) fn render_error(error: ApiError) -> Response {
    let mut response = error_response(error.status, error.code, &error.message, error.next_seq);
    response.headers.extend(error.extra);
    response
}

/// Protocol errors found by the HTTP layer (malformed requests, oversized bodies).
/// Counted in `pico_http_responses_total` here: no handler's answer passes `respond` for these.
pub fn connection_error(status: u16, message: &str) -> Response {
    crate::admin::metrics::count_connection_error(crate::config::Protocol::Pico, status);
    let code = match status {
        413 => "too_large",
        417 => "expectation_failed",
        429 => "overloaded",
        501 => "not_implemented",
        503 => "unavailable",
        _ => "bad_request",
    };
    with_common(error_response(status, code, message, None), "*")
}

pub(super) fn with_common(mut response: Response, origin: &str) -> Response {
    response
        .headers
        .push(("x-content-type-options", "nosniff".into()));
    response
        .headers
        .push(("cross-origin-resource-policy", "same-origin".into()));
    response
        .headers
        .push(("access-control-allow-origin", allow_origin(origin)));
    response
        .headers
        .push(("access-control-expose-headers", EXPOSE_HEADERS.into()));
    response
}
