//! One S3 REST call (re-signed on every attempt) and its complete answer; which answers are
//! worth retrying.

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::Method;
use reqwest::StatusCode;

use crate::limits::{HASH_OFF_THREAD_MIN_BYTES, S3_ANSWER_BYTES_MAX, S3_ERROR_ANSWER_BYTES_MAX};
use crate::sigv4;
use crate::xml;

/// One S3 REST call, re-signed on every attempt.
pub(super) struct Call {
    pub(super) method: Method,
    /// `None`: a bucket-level call.
    pub(super) key: Option<String>,
    pub(super) query: Vec<(String, String)>,
    /// Extra headers, all signed (e.g. `range`).
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Bytes,
    /// Hex SHA-256 of `body`, or `UNSIGNED-PAYLOAD`.
    pub(super) payload_hash: String,
    /// CompleteMultipartUpload can fail with a 200 whose body is an `<Error>`.
    pub(super) error_in_ok_body: bool,
    /// How much of a successful answer's body is read.
    pub(super) answer_limit: AnswerLimit,
}

/// How much of a successful answer's body is read: the store is a peer like any other, and a
/// body it sends without end (or a range it ignores on a large object) must not fill memory.
/// An error answer's body is read up to [`S3_ERROR_ANSWER_BYTES_MAX`] and cut there (it only
/// feeds the error message).
#[derive(Clone, Copy, Debug)]
pub(super) enum AnswerLimit {
    /// Longer is a failure of the call (`Answer::truncated`).
    Bytes(usize),
    /// A GET of bytes `start..end`: a `206` holds `end - start` bytes and no more; a `200` (a
    /// store that ignores ranges sends the whole object) is read up to `end` and cut there.
    Range { start: u64, end: u64 },
    /// A GET of an object's first bytes: read up to this many and cut there.
    Prefix(usize),
}

impl AnswerLimit {
    /// The most bytes read of an answer with `status`.
    pub(super) fn bytes_max(self, status: StatusCode) -> usize {
        let cap = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        match self {
            _ if !status.is_success() => S3_ERROR_ANSWER_BYTES_MAX,
            AnswerLimit::Bytes(max) | AnswerLimit::Prefix(max) => max,
            AnswerLimit::Range { start, end } if status == StatusCode::PARTIAL_CONTENT => {
                cap(end.saturating_sub(start))
            }
            AnswerLimit::Range { end, .. } => cap(end),
        }
    }
}

impl Call {
    pub(super) fn new(method: Method, key: Option<&str>) -> Call {
        Call {
            method,
            key: key.map(str::to_string),
            query: Vec::new(),
            headers: Vec::new(),
            body: Bytes::new(),
            payload_hash: sigv4::UNSIGNED_PAYLOAD.to_string(),
            error_in_ok_body: false,
            answer_limit: AnswerLimit::Bytes(S3_ANSWER_BYTES_MAX),
        }
    }

    pub(super) fn answer_limit(mut self, limit: AnswerLimit) -> Call {
        self.answer_limit = limit;
        self
    }

    pub(super) fn query(mut self, name: &str, value: &str) -> Call {
        self.query.push((name.to_string(), value.to_string()));
        self
    }

    pub(super) fn header(mut self, name: &str, value: &str) -> Call {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub(super) async fn body(mut self, body: Bytes) -> Call {
        self.payload_hash = hash(body.clone()).await;
        self.body = body;
        self
    }
}

/// SHA-256 of a body; big ones on the blocking pool so the runtime thread keeps serving.
async fn hash(body: Bytes) -> String {
    if body.len() < HASH_OFF_THREAD_MIN_BYTES {
        return sigv4::sha256_hex(&body);
    }
    let hashed = tokio::task::spawn_blocking({
        let body = body.clone();
        move || sigv4::sha256_hex(&body)
    })
    .await;
    hashed.unwrap_or_else(|_| sigv4::sha256_hex(&body))
}

/// A complete answer (the body is read inside the attempt, so a broken body is retried too).
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// The body went on past the call's [`AnswerLimit`]; `body` holds what came before.
    pub(super) truncated: bool,
}

impl Answer {
    /// `(Code, Message)` of an error body.
    pub(super) fn error(&self) -> (String, String) {
        xml::parse_error(&String::from_utf8_lossy(&self.body))
    }

    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// Why an answer is worth retrying, or `None` if it is final.
pub(super) fn transient(answer: &Answer, error_in_ok_body: bool) -> Option<String> {
    let status = answer.status;
    let retry = status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || (status == StatusCode::BAD_REQUEST && answer.error().0 == "RequestTimeout")
        || (error_in_ok_body && status.is_success() && is_error_body(&answer.body));
    if !retry {
        return None;
    }
    let (code, message) = answer.error();
    Some(format!("HTTP {status} {code} {message}").trim().to_string())
}

/// A 200 answer can still carry an `<Error>` (CompleteMultipartUpload).
pub(super) fn is_error_body(body: &[u8]) -> bool {
    xml::root_name(&String::from_utf8_lossy(body)).as_deref() == Some("Error")
}
