//! One S3 REST call (re-signed on every attempt) and its complete answer; which answers are
//! worth retrying.

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::Method;
use reqwest::StatusCode;

use crate::limits::HASH_OFF_THREAD_MIN_BYTES;
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
        }
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
