//! Parses a webhook receiver's answer: pure, over the bytes read so far, so the delivery client
//! and the fuzz target run the same code. The receiver is untrusted: every size it declares is
//! checked against the limits below before any arithmetic, and an answer that would pass one
//! fails the delivery (`Err`) instead of being read on.
//!
//! - the head (status line, headers, interim `1xx` answers) is at most
//!   [`WEBHOOK_RESPONSE_HEAD_BYTES_MAX`] bytes and [`RESPONSE_HEADERS_MAX`] headers;
//! - the body is at most [`WEBHOOK_RESPONSE_BODY_BYTES_MAX`] bytes, whether its length comes
//!   from `Content-Length`, from chunk sizes or from the connection closing;
//! - a chunk-size line is at most [`CHUNK_SIZE_LINE_BYTES_MAX`] bytes and its size at most 16
//!   hex digits;
//! - the client stops reading at [`WEBHOOK_RESPONSE_BYTES_MAX`] bytes in all (chunk framing
//!   included), so whatever the receiver sends, the node holds at most that much of it.

use crate::limits::{
    CHUNK_SIZE_LINE_BYTES_MAX, WEBHOOK_RESPONSE_BODY_BYTES_MAX, WEBHOOK_RESPONSE_HEAD_BYTES_MAX,
};

/// Headers of one answer; more fail the delivery.
pub const RESPONSE_HEADERS_MAX: usize = 64;

/// The most bytes of an answer the client reads: the head, the body and chunk framing. A chunked
/// body of 1-byte chunks needs 6 bytes per body byte, and chunk extensions more: such an answer
/// fails here rather than being read for as long as the receiver likes.
pub const WEBHOOK_RESPONSE_BYTES_MAX: usize =
    WEBHOOK_RESPONSE_HEAD_BYTES_MAX + 4 * WEBHOOK_RESPONSE_BODY_BYTES_MAX;

/// A final answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What the bytes read so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// The answer is complete.
    Complete(Answer),
    /// More bytes are needed; `eof` was false.
    Partial,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
    Empty,
}

/// Why a receiver's answer fails the delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerError {
    /// A status under 100 (the status).
    BadStatus(u16),
    /// Not an HTTP/1.x response head (httparse's reason).
    Malformed(httparse::Error),
    /// The head is longer than [`WEBHOOK_RESPONSE_HEAD_BYTES_MAX`] bytes.
    HeadTooLarge,
    /// More than [`RESPONSE_HEADERS_MAX`] headers.
    TooManyHeaders,
    /// The connection closed before the head was complete.
    ClosedEarly,
    /// The connection closed before the body was complete.
    ClosedInBody,
    /// The body is longer than [`WEBHOOK_RESPONSE_BODY_BYTES_MAX`] bytes (declared or sent).
    BodyTooLarge,
    /// A `Transfer-Encoding` whose last coding is not `chunked`.
    NotChunked,
    ConflictingLengths,
    BadLength,
    /// A chunk-size line longer than [`CHUNK_SIZE_LINE_BYTES_MAX`] bytes.
    ChunkLineTooLong,
    BadChunkSize,
    /// A chunk's data not followed by CRLF.
    ChunkWithoutCrlf,
}

impl std::fmt::Display for AnswerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnswerError::BadStatus(status) => write!(f, "bad answer: status {status}"),
            AnswerError::Malformed(e) => write!(f, "bad answer: {e}"),
            AnswerError::HeadTooLarge => write!(
                f,
                "the answer's head is longer than {WEBHOOK_RESPONSE_HEAD_BYTES_MAX} bytes"
            ),
            AnswerError::TooManyHeaders => {
                write!(f, "the answer has more than {RESPONSE_HEADERS_MAX} headers")
            }
            AnswerError::ClosedEarly => {
                f.write_str("the receiver closed the connection before a complete answer")
            }
            AnswerError::ClosedInBody => {
                f.write_str("the receiver closed the connection inside the body")
            }
            AnswerError::BodyTooLarge => write!(
                f,
                "the answer's body is longer than {WEBHOOK_RESPONSE_BODY_BYTES_MAX} bytes"
            ),
            AnswerError::NotChunked => f.write_str("the answer's Transfer-Encoding is not chunked"),
            AnswerError::ConflictingLengths => {
                f.write_str("the answer has conflicting Content-Length headers")
            }
            AnswerError::BadLength => f.write_str("the answer has a bad Content-Length"),
            AnswerError::ChunkLineTooLong => write!(
                f,
                "a chunk-size line of the answer is longer than {CHUNK_SIZE_LINE_BYTES_MAX} bytes"
            ),
            AnswerError::BadChunkSize => f.write_str("the answer has a bad chunk size"),
            AnswerError::ChunkWithoutCrlf => {
                f.write_str("a chunk of the answer does not end with CRLF")
            }
        }
    }
}

impl std::error::Error for AnswerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AnswerError::Malformed(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses `buf`, all the bytes of the answer read so far; `eof`: the receiver closed the
/// connection after them. `Err` names what was wrong (the delivery fails with it).
pub fn parse(buf: &[u8], eof: bool) -> Result<Parsed, AnswerError> {
    // Interim answers are skipped; each takes at least one byte, so the loop ends.
    let mut at = 0;
    let (status, framing) = loop {
        let rest = &buf[at..];
        let mut headers = [httparse::EMPTY_HEADER; RESPONSE_HEADERS_MAX];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(rest) {
            Ok(httparse::Status::Complete(len)) => {
                let status = response.code.unwrap_or(0);
                if status < 100 {
                    return Err(AnswerError::BadStatus(status));
                }
                let framing = framing(status, response.headers)?;
                at = at.checked_add(len).ok_or(AnswerError::HeadTooLarge)?;
                if at > WEBHOOK_RESPONSE_HEAD_BYTES_MAX {
                    return Err(AnswerError::HeadTooLarge);
                }
                if (100..200).contains(&status) {
                    continue;
                }
                break (status, framing);
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() > WEBHOOK_RESPONSE_HEAD_BYTES_MAX {
                    return Err(AnswerError::HeadTooLarge);
                }
                return if eof {
                    Err(AnswerError::ClosedEarly)
                } else {
                    Ok(Parsed::Partial)
                };
            }
            Err(httparse::Error::TooManyHeaders) => return Err(AnswerError::TooManyHeaders),
            Err(e) => return Err(AnswerError::Malformed(e)),
        }
    };
    let body = &buf[at..];
    let complete = |body: &[u8]| {
        Ok(Parsed::Complete(Answer {
            status,
            body: body.to_vec(),
        }))
    };
    match framing {
        Framing::Empty => complete(&[]),
        Framing::Length(len) => match body.get(..len) {
            Some(body) => complete(body),
            None if eof => Err(AnswerError::ClosedInBody),
            None => Ok(Parsed::Partial),
        },
        Framing::UntilClose if body.len() > WEBHOOK_RESPONSE_BODY_BYTES_MAX => {
            Err(AnswerError::BodyTooLarge)
        }
        Framing::UntilClose if eof => complete(body),
        Framing::UntilClose => Ok(Parsed::Partial),
        Framing::Chunked => match decode_chunks(body)? {
            Some(decoded) => complete(&decoded),
            None if eof => Err(AnswerError::ClosedInBody),
            None => Ok(Parsed::Partial),
        },
    }
}

/// How the body of an answer with `status` and `headers` ends. `Transfer-Encoding` wins over
/// `Content-Length` (RFC 9112 §6.3); a declared length over the limit fails at once.
fn framing(status: u16, headers: &[httparse::Header<'_>]) -> Result<Framing, AnswerError> {
    if (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(Framing::Empty);
    }
    let mut length: Option<usize> = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let chunked = std::str::from_utf8(h.value).is_ok_and(|v| {
                v.rsplit(',')
                    .next()
                    .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
            });
            if !chunked {
                return Err(AnswerError::NotChunked);
            }
            return Ok(Framing::Chunked);
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = content_length(h.value)?;
            if length.is_some_and(|l| l != value) {
                return Err(AnswerError::ConflictingLengths);
            }
            length = Some(value);
        }
    }
    Ok(length.map_or(Framing::UntilClose, Framing::Length))
}

/// A `Content-Length` value: digits only, at most the body limit.
fn content_length(value: &[u8]) -> Result<usize, AnswerError> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(AnswerError::BadLength);
    }
    // Leading zeros aside, more digits than the limit has is over it (and would overflow).
    let significant = digits
        .iter()
        .position(|&d| d != b'0')
        .map_or(&digits[digits.len()..], |i| &digits[i..]);
    if significant.len() > 9 {
        return Err(AnswerError::BodyTooLarge);
    }
    let mut length: usize = 0;
    for &d in significant {
        length = length
            .checked_mul(10)
            .and_then(|l| l.checked_add(usize::from(d - b'0')))
            .ok_or(AnswerError::BodyTooLarge)?;
    }
    if length > WEBHOOK_RESPONSE_BODY_BYTES_MAX {
        return Err(AnswerError::BodyTooLarge);
    }
    Ok(length)
}

/// Decodes a chunked body: `Some(body)` once the last chunk is in (trailers are not waited
/// for: the node closes the connection), `None` while more bytes are needed.
fn decode_chunks(buf: &[u8]) -> Result<Option<Vec<u8>>, AnswerError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    // Each round consumes at least a "0\r\n"-sized line or returns, so it ends.
    loop {
        let rest = &buf[at..];
        let window = &rest[..rest.len().min(CHUNK_SIZE_LINE_BYTES_MAX + 2)];
        let Some(line_len) = window.windows(2).position(|w| w == b"\r\n") else {
            if rest.len() > CHUNK_SIZE_LINE_BYTES_MAX + 1 {
                return Err(AnswerError::ChunkLineTooLong);
            }
            return Ok(None);
        };
        let size = chunk_size(&rest[..line_len])?;
        // `line_len + 2 <= rest.len()`, so this is within `buf`.
        at += line_len + 2;
        if size == 0 {
            return Ok(Some(out));
        }
        let room = WEBHOOK_RESPONSE_BODY_BYTES_MAX - out.len();
        if size > room as u64 {
            return Err(AnswerError::BodyTooLarge);
        }
        // `size <= room <= WEBHOOK_RESPONSE_BODY_BYTES_MAX`: the sums below cannot overflow.
        let size = size as usize;
        let rest = &buf[at..];
        let Some(data) = rest.get(..size) else {
            return Ok(None);
        };
        match rest.get(size..size + 2) {
            None if rest.len() <= size + 1 && rest[size..].iter().all(|&b| b == b'\r') => {
                return Ok(None)
            }
            Some(b"\r\n") => {}
            _ => return Err(AnswerError::ChunkWithoutCrlf),
        }
        out.extend_from_slice(data);
        at += size + 2;
    }
}

/// The size of a chunk-size line (`hex[;extensions]`): 1 to 16 hex digits.
fn chunk_size(line: &[u8]) -> Result<u64, AnswerError> {
    let hex = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or(&[])
        .trim_ascii();
    if hex.is_empty() || hex.len() > 16 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return Err(AnswerError::BadChunkSize);
    }
    let mut size: u64 = 0;
    for &d in hex {
        let digit = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(digit)))
            .ok_or(AnswerError::BadChunkSize)?;
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn complete(status: u16, body: &[u8]) -> Result<Parsed, AnswerError> {
        Ok(Parsed::Complete(Answer {
            status,
            body: body.to_vec(),
        }))
    }

    #[test]
    fn reads_the_three_framings_after_interim_answers() {
        let chunked = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"don\r\n8;x=y\r\ne\":true}\r\n0\r\n\r\n";
        assert_eq!(parse(chunked, false), complete(202, b"{\"done\":true}"));
        let length = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}extra";
        assert_eq!(parse(length, false), complete(200, b"{}"));
        assert_eq!(
            parse(b"HTTP/1.1 500 Oops\r\n\r\nbroken", false),
            Ok(Parsed::Partial)
        );
        assert_eq!(
            parse(b"HTTP/1.1 500 Oops\r\n\r\nbroken", true),
            complete(500, b"broken")
        );
        assert_eq!(
            parse(b"HTTP/1.1 204 No Content\r\n\r\n", false),
            complete(204, b"")
        );
    }

    #[test]
    fn every_prefix_of_an_answer_is_partial_until_it_is_complete() {
        let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let done = answer.len() - 2;
        for cut in 0..done {
            assert_eq!(parse(&answer[..cut], false), Ok(Parsed::Partial), "{cut}");
            assert!(parse(&answer[..cut], true).is_err(), "{cut}");
        }
        assert_eq!(parse(&answer[..done], false), complete(200, b"abc"));
    }

    /// `ffffffffffffffff` would overflow `at + size + 2` (a panic that takes the node down),
    /// and `7fffffffffffffff` would make it buffer whatever follows: both fail first.
    #[test]
    fn declared_sizes_past_the_limits_fail_before_any_arithmetic() {
        for size in ["ffffffffffffffff", "7fffffffffffffff", "10001"] {
            let answer =
                format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nxx");
            let err = parse(answer.as_bytes(), false).unwrap_err();
            assert_eq!(err, AnswerError::BodyTooLarge, "{size}");
            assert!(err.to_string().contains("longer than 65536"), "{err}");
        }
        // 17 digits, or a sign, are not chunk sizes.
        for size in ["10000000000000000", "+1", "-1", "0x1", ""] {
            let answer =
                format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nx");
            assert_eq!(
                parse(answer.as_bytes(), false),
                Err(AnswerError::BadChunkSize),
                "{size}"
            );
        }
        // A body that only adds up past the limit.
        let mut answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..2 {
            answer.extend_from_slice(b"8000\r\n");
            answer.extend_from_slice(&[b'x'; 0x8000]);
            answer.extend_from_slice(b"\r\n");
        }
        answer.extend_from_slice(b"1\r\n");
        assert_eq!(parse(&answer, false), Err(AnswerError::BodyTooLarge));
        for length in ["65537", "18446744073709551616", "99999999999999999999999"] {
            let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n");
            assert_eq!(
                parse(answer.as_bytes(), false),
                Err(AnswerError::BodyTooLarge),
                "{length}"
            );
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\n\r\n{}",
            "x".repeat(WEBHOOK_RESPONSE_BODY_BYTES_MAX + 1)
        );
        assert_eq!(
            parse(answer.as_bytes(), false),
            Err(AnswerError::BodyTooLarge)
        );
    }

    #[test]
    fn malformed_answers_fail() {
        for (answer, error) in [
            (
                &b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"[..],
                AnswerError::ConflictingLengths,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                AnswerError::BadLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                AnswerError::NotChunked,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n0\r\n\r\n",
                AnswerError::ChunkWithoutCrlf,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\rX0\r\n\r\n",
                AnswerError::ChunkWithoutCrlf,
            ),
            (
                b"SMTP ready\r\n\r\n",
                AnswerError::Malformed(httparse::Error::Version),
            ),
        ] {
            assert_eq!(
                parse(answer, false),
                Err(error),
                "{}",
                String::from_utf8_lossy(answer)
            );
        }
        let long_line = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;{}",
            "x".repeat(CHUNK_SIZE_LINE_BYTES_MAX)
        );
        assert_eq!(
            parse(long_line.as_bytes(), false),
            Err(AnswerError::ChunkLineTooLong)
        );
        let long_head = format!(
            "HTTP/1.1 200 OK\r\nX: {}",
            "x".repeat(WEBHOOK_RESPONSE_HEAD_BYTES_MAX)
        );
        assert_eq!(
            parse(long_head.as_bytes(), false),
            Err(AnswerError::HeadTooLarge)
        );
        let many = format!("HTTP/1.1 200 OK\r\n{}\r\n", "X: y\r\n".repeat(65));
        assert_eq!(
            parse(many.as_bytes(), false),
            Err(AnswerError::TooManyHeaders)
        );
    }

    proptest! {
        #![proptest_config(crate::fuzzing::config())]

        /// Fuzz target `webhook_response`: whatever a receiver answers, cut anywhere, parsing
        /// never panics and a complete answer's body is within the limit.
        #[test]
        fn fuzz_webhook_response(input in crate::fuzzing::inputs("webhook_response"), cut in any::<usize>()) {
            let cut = cut % (input.len() + 1);
            for (bytes, eof) in [(&input[..], true), (&input[..], false), (&input[..cut], false)] {
                if let Ok(Parsed::Complete(answer)) = parse(bytes, eof) {
                    prop_assert!(answer.body.len() <= WEBHOOK_RESPONSE_BODY_BYTES_MAX);
                    prop_assert!((200..1000).contains(&answer.status));
                }
            }
        }
    }
}
