//! The client's error type and the status → kind mapping (statuses as in docs/api.md,
//! "Errors").

use pico_proto::header::*;
use std::error::Error as _;
use std::fmt;

use reqwest::header::HeaderMap;

use crate::position::Position;

/// What went wrong, coarsely, so callers can branch without parsing messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: the request was malformed or asked for something impossible.
    BadRequest,
    /// 403: a producer with a newer epoch exists.
    StaleEpoch,
    /// 404: no such stream.
    NotFound,
    /// 409 on a closed stream.
    Closed,
    /// 409 for other conflicts, 412 failed `Pico-Match-Seq`.
    Conflict,
    /// 410: the position was trimmed away.
    OffsetGone,
    /// Any other HTTP error status.
    Other,
    /// The request did not get an HTTP answer (connect, timeout, reset, ...).
    Transport,
    /// An HTTP answer that does not follow the protocol (missing header, bad body).
    InvalidResponse,
    /// The operation is not available (e.g. not implemented for the chosen protocol).
    Unsupported,
    /// A bad argument detected before anything was sent (e.g. an unparsable endpoint).
    InvalidArgument,
    /// A producer session that was closed, or whose background task is gone.
    Stopped,
}

/// An error status answered by the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub status: u16,
    /// The `error` field of the JSON body (e.g. `not_found`; Durable Streams nests it as
    /// `error.code`, e.g. `STREAM_CLOSED`), or a stand-in derived from the status when the
    /// body has none (HEAD and some 404s have empty bodies).
    pub code: String,
    /// The `message` field of the JSON body (Durable Streams: `error.message`); may be empty.
    pub message: String,
    /// The stream's tail when the server reported it (`next_seq` / `Pico-Next-Seq`, or
    /// `Stream-Next-Offset`).
    pub next: Option<Position>,
    /// `Retry-After` in seconds (429 overloaded, 503), when the server sent one.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error known only by its status and a message (a `HEAD` answer has no body; the admin
    /// API's bodies carry a sentence, not a code). The code is the status's reason phrase in
    /// the protocol's spelling (`not_found`, `unauthorized`, `forbidden`), not a guess at a
    /// stream error (a bare 403 is not necessarily a fenced producer).
    pub fn from_status(status: u16, message: impl Into<String>) -> ApiError {
        let code = reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .map(|reason| reason.to_ascii_lowercase().replace([' ', '-'], "_"))
            .unwrap_or_else(|| format!("http_{status}"));
        ApiError {
            kind: kind_for_status(status, None, false),
            status,
            code,
            message: message.into(),
            next: None,
            retry_after: None,
        }
    }

    /// Builds the error from a non-2xx response's status, headers and body.
    pub fn from_response(status: u16, headers: &HeaderMap, body: &[u8]) -> ApiError {
        // Either protocol's shape (pico_proto::error_body).
        let decoded = pico_proto::error_body::decode(body);
        let code = decoded.as_ref().and_then(|e| e.code.clone());
        let next_seq = decoded.as_ref().and_then(|e| e.next_seq);
        let mut message = match decoded {
            Some(e) => e.message.unwrap_or_default(),
            // 503s from the router carry their reason in `X-Error`; other non-JSON bodies are
            // shown as text so proxies' error pages are not lost.
            None => header_str(headers, "x-error")
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    String::from_utf8_lossy(body)
                        .trim()
                        .chars()
                        .take(200)
                        .collect()
                }),
        };
        // Producer errors carry their detail in headers: say it in the message.
        let producer_header = |suffix: &str| {
            header_str(headers, &format!("pico-{suffix}"))
                .or_else(|| header_str(headers, &format!("producer-{suffix}")))
        };
        if let (Some(expected), Some(received)) = (
            producer_header("expected-seq"),
            producer_header("received-seq"),
        ) {
            message = join_message(
                message,
                format!("expected seq {expected}, received {received}"),
            );
        }
        if status == 403 {
            if let Some(epoch) = header_str(headers, PICO_PRODUCER_EPOCH)
                .or_else(|| header_str(headers, PRODUCER_EPOCH))
            {
                message = join_message(message, format!("current epoch {epoch}"));
            }
        }
        let next = next_seq
            .or_else(|| header_str(headers, PICO_NEXT_SEQ).and_then(|v| v.parse().ok()))
            .map(Position::Seq)
            .or_else(|| header_str(headers, STREAM_NEXT_OFFSET).map(Position::from));
        let closed = header_str(headers, PICO_CLOSED)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || header_str(headers, STREAM_CLOSED).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let kind = kind_for_status(status, code.as_deref(), closed);
        ApiError {
            retry_after: header_str(headers, "retry-after").and_then(|v| v.parse().ok()),
            kind,
            status,
            code: code.unwrap_or_else(|| default_code(kind, status)),
            message,
            next,
        }
    }
}

/// The kind of a refusal: by status, except that a `409` with `Pico-Closed` (or code `closed`)
/// is [`ErrorKind::Closed`] rather than a conflict.
pub fn kind_for_status(status: u16, code: Option<&str>, closed_header: bool) -> ErrorKind {
    match status {
        400 => ErrorKind::BadRequest,
        403 => ErrorKind::StaleEpoch,
        404 => ErrorKind::NotFound,
        409 if closed_header || code == Some("closed") => ErrorKind::Closed,
        409 | 412 => ErrorKind::Conflict,
        410 => ErrorKind::OffsetGone,
        _ => ErrorKind::Other,
    }
}

fn default_code(kind: ErrorKind, status: u16) -> String {
    match kind {
        ErrorKind::BadRequest => "bad_request".into(),
        ErrorKind::StaleEpoch => "fenced".into(),
        ErrorKind::NotFound => "not_found".into(),
        ErrorKind::Closed => "closed".into(),
        ErrorKind::Conflict if status == 412 => "match_failed".into(),
        ErrorKind::Conflict => "conflict".into(),
        ErrorKind::OffsetGone => "offset_gone".into(),
        _ => format!("http_{status}"),
    }
}

fn join_message(message: String, detail: String) -> String {
    if message.is_empty() {
        detail
    } else {
        format!("{message}: {detail}")
    }
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

impl fmt::Display for ApiError {
    /// `<code> (<status>): <message> [next=<n>]`, the form `pico` prints (README.md, "Use it").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.code, self.status)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        if let Some(next) = &self.next {
            write!(f, " [next={next}]")?;
        }
        Ok(())
    }
}

/// Every error the client returns. `Clone`, so a producer session can hand the error that
/// poisoned it to every later caller.
#[derive(Clone, Debug)]
pub enum ClientError {
    /// The server answered with an error status.
    Api(ApiError),
    /// No HTTP answer: the message includes the whole cause chain.
    Transport(String),
    /// The answer does not follow the protocol.
    InvalidResponse(String),
    Unsupported(String),
    InvalidArgument(String),
    /// The producer session was closed, or its background task stopped (runtime shut down).
    Stopped(String),
}

impl ClientError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Api(e) => e.kind,
            ClientError::Transport(_) => ErrorKind::Transport,
            ClientError::InvalidResponse(_) => ErrorKind::InvalidResponse,
            ClientError::Unsupported(_) => ErrorKind::Unsupported,
            ClientError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            ClientError::Stopped(_) => ErrorKind::Stopped,
        }
    }

    /// The HTTP status, for errors the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api(e) => Some(e.status),
            _ => None,
        }
    }

    /// The `error` code of a server answer (`sequence_gap`, `fenced`, ...).
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api(e) => Some(&e.code),
            _ => None,
        }
    }

    /// How long the server asked to wait before retrying (`Retry-After`), if it did.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ClientError::Api(e) => e.retry_after.map(std::time::Duration::from_secs),
            _ => None,
        }
    }

    /// A producer request arrived before its predecessor (`409 sequence_gap`).
    pub fn is_sequence_gap(&self) -> bool {
        self.status() == Some(409) && self.code() == Some("sequence_gap")
    }

    /// The server refused a producer request because an earlier one has not landed yet: a
    /// sequence gap, or (before the producer's first request is applied) the `400` for a
    /// producer the stream does not know sending a sequence other than 0.
    pub fn is_out_of_order(&self) -> bool {
        self.is_sequence_gap()
            || matches!(self, ClientError::Api(e) if e.status == 400
                && e.message == "New epoch must start with sequence 0")
    }

    /// Worth retrying with the same request: a transport error, 429 or 5xx (failures that pass).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Transport(_) => true,
            ClientError::Api(e) => e.status == 429 || e.status >= 500,
            _ => false,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Api(e) => e.fmt(f),
            ClientError::Transport(m) => write!(f, "transport error: {m}"),
            ClientError::InvalidResponse(m) => write!(f, "invalid response: {m}"),
            ClientError::Unsupported(m)
            | ClientError::InvalidArgument(m)
            | ClientError::Stopped(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<ApiError> for ClientError {
    fn from(e: ApiError) -> ClientError {
        ClientError::Api(e)
    }
}

impl From<reqwest::Error> for ClientError {
    /// reqwest's own message is only the outermost layer ("error sending request for url");
    /// the useful part ("Connection refused") is deeper in the source chain.
    fn from(e: reqwest::Error) -> ClientError {
        ClientError::Transport(transport_message(&e))
    }
}

/// A reqwest error as one line: its source chain, then what to do about a refused
/// certificate. reqwest's own message is only the outermost layer.
pub fn transport_message(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    let mut advice = None;
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        advice = advice.or_else(|| certificate_advice(cause));
        source = cause.source();
    }
    if let Some(advice) = advice {
        message.push_str(": ");
        message.push_str(advice);
    }
    message
}

/// What is wrong with a server certificate the client refused, and what to do, for the
/// refusals people meet with certificates they made themselves; rustls names them only as
/// e.g. `invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))`.
fn certificate_advice(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    // The TLS error comes wrapped in io::Errors (two, from tokio-rustls and hyper-util),
    // whose source() skips what they wrap.
    let mut current = error;
    let tls = loop {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            break tls;
        }
        match current
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => current = inner,
            None => return None,
        }
    };
    let rustls::Error::InvalidCertificate(error) = tls else {
        return None;
    };
    use rustls::CertificateError as E;
    Some(match error {
        E::Other(other)
            if matches!(
                other.0.downcast_ref::<webpki::Error>(),
                Some(webpki::Error::CaUsedAsEndEntity)
            ) =>
        {
            "the server's certificate is a CA certificate (CA:TRUE, as `openssl req -x509` makes \
             by default), which clients refuse as a server's own: serve a certificate signed by \
             a CA and trust that CA (`pico cert` makes both; see docs/tls.md)"
        }
        E::UnknownIssuer => {
            "the server's certificate is not signed by a CA this client trusts: pass the CA's \
             certificate with --ca-cert (for `pico cert`: its ca.pem)"
        }
        E::BadSignature => {
            "the server's certificate was not signed by the trusted CA of that name: pass the \
             CA's certificate that signed it with --ca-cert"
        }
        E::NotValidForName | E::NotValidForNameContext { .. } => {
            "the server's certificate does not name the endpoint's host: connect by a name it \
             lists, or make one that lists this host (`pico cert --host NAME`)"
        }
        E::Expired | E::ExpiredContext { .. } => {
            "the server's certificate has expired (or this machine's clock is wrong)"
        }
        E::NotValidYet | E::NotValidYetContext { .. } => {
            "the server's certificate is not valid yet (or this machine's clock is wrong)"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use reqwest::header::{HeaderMap, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn status_mapping_follows_the_reference() {
        assert_eq!(kind_for_status(400, None, false), ErrorKind::BadRequest);
        assert_eq!(
            kind_for_status(403, Some("fenced"), false),
            ErrorKind::StaleEpoch
        );
        assert_eq!(kind_for_status(404, None, false), ErrorKind::NotFound);
        assert_eq!(
            kind_for_status(409, Some("closed"), false),
            ErrorKind::Closed
        );
        assert_eq!(
            kind_for_status(409, Some("conflict"), true),
            ErrorKind::Closed
        );
        assert_eq!(
            kind_for_status(409, Some("sequence_gap"), false),
            ErrorKind::Conflict
        );
        assert_eq!(
            kind_for_status(412, Some("match_failed"), false),
            ErrorKind::Conflict
        );
        assert_eq!(kind_for_status(410, None, false), ErrorKind::OffsetGone);
        assert_eq!(kind_for_status(413, None, false), ErrorKind::Other);
        assert_eq!(kind_for_status(500, None, false), ErrorKind::Other);
    }

    #[test]
    fn json_error_is_displayed_like_the_reference() {
        let body = br#"{"error":"closed","message":"stream is closed","next_seq":12}"#;
        let err = ApiError::from_response(409, &headers(&[(PICO_CLOSED, "true")]), body);
        assert_eq!(err.kind, ErrorKind::Closed);
        assert_eq!(err.next, Some(Position::Seq(12)));
        assert_eq!(err.to_string(), "closed (409): stream is closed [next=12]");
    }

    #[test]
    fn next_comes_from_the_header_when_the_body_lacks_it() {
        let body =
            br#"{"error":"match_failed","message":"match failed: expected tail 1, actual 3"}"#;
        let err = ApiError::from_response(412, &headers(&[(PICO_NEXT_SEQ, "3")]), body);
        assert_eq!(err.kind, ErrorKind::Conflict);
        assert_eq!(
            err.to_string(),
            "match_failed (412): match failed: expected tail 1, actual 3 [next=3]"
        );
    }

    #[test]
    fn empty_bodies_get_a_code_from_the_status() {
        let err = ApiError::from_response(404, &HeaderMap::new(), b"");
        assert_eq!(err.to_string(), "not_found (404)");
        let err = ApiError::from_response(
            503,
            &headers(&[("x-error", "lookup failed"), ("retry-after", "2")]),
            b"",
        );
        assert_eq!(err.kind, ErrorKind::Other);
        assert_eq!(err.retry_after, Some(2));
        assert_eq!(err.to_string(), "http_503 (503): lookup failed");
        assert!(ClientError::Api(err).is_retryable());
    }

    #[test]
    fn producer_errors_show_their_headers() {
        let body = br#"{"error":"sequence_gap","message":"Producer sequence gap"}"#;
        let err = ApiError::from_response(
            409,
            &headers(&[(PICO_EXPECTED_SEQ, "3"), (PICO_RECEIVED_SEQ, "5")]),
            body,
        );
        assert_eq!(
            err.to_string(),
            "sequence_gap (409): Producer sequence gap: expected seq 3, received 5"
        );
        assert!(ClientError::Api(err).is_sequence_gap());
        let body = br#"{"error":"fenced","message":"Stale producer epoch"}"#;
        let err = ApiError::from_response(403, &headers(&[(PICO_PRODUCER_EPOCH, "7")]), body);
        assert_eq!(
            err.to_string(),
            "fenced (403): Stale producer epoch: current epoch 7"
        );
        assert_eq!(err.kind, ErrorKind::StaleEpoch);
    }

    #[test]
    fn durable_streams_errors_nest_code_and_message() {
        let body = br#"{"error":{"code":"STREAM_CLOSED","message":"stream is closed"}}"#;
        let err = ApiError::from_response(
            409,
            &headers(&[
                (STREAM_CLOSED, "true"),
                (STREAM_NEXT_OFFSET, "0000000000000003_0000000000000000"),
            ]),
            body,
        );
        assert_eq!(err.kind, ErrorKind::Closed);
        assert_eq!(
            err.next,
            Some(Position::from("0000000000000003_0000000000000000"))
        );
        assert_eq!(
            err.to_string(),
            "STREAM_CLOSED (409): stream is closed [next=0000000000000003_0000000000000000]"
        );
        // A content-type mismatch is a plain conflict: no Stream-Closed.
        let body = br#"{"error":{"code":"CONFLICT","message":"content type mismatch"}}"#;
        let err = ApiError::from_response(409, &HeaderMap::new(), body);
        assert_eq!(err.kind, ErrorKind::Conflict);
        assert_eq!(err.to_string(), "CONFLICT (409): content type mismatch");
        let body = br#"{"error":{"code":"SEQUENCE_GAP","message":"gap"}}"#;
        let err = ApiError::from_response(
            409,
            &headers(&[(PRODUCER_EXPECTED_SEQ, "1"), (PRODUCER_RECEIVED_SEQ, "4")]),
            body,
        );
        assert_eq!(
            err.to_string(),
            "SEQUENCE_GAP (409): gap: expected seq 1, received 4"
        );
        let body = br#"{"error":{"code":"STALE_EPOCH","message":"stale"}}"#;
        let err = ApiError::from_response(403, &headers(&[(PRODUCER_EPOCH, "2")]), body);
        assert_eq!(err.kind, ErrorKind::StaleEpoch);
        assert_eq!(err.to_string(), "STALE_EPOCH (403): stale: current epoch 2");
        let err = ApiError::from_response(410, &HeaderMap::new(), br#"{"error":{"code":"GONE"}}"#);
        assert_eq!(err.kind, ErrorKind::OffsetGone);
        assert_eq!(err.to_string(), "GONE (410)");
    }

    #[test]
    fn json_without_message_has_no_colon() {
        let err = ApiError::from_response(400, &HeaderMap::new(), br#"{"error":"bad_request"}"#);
        assert_eq!(err.to_string(), "bad_request (400)");
    }
}
