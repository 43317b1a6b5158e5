//! Error bodies. Pico answers `{"error":"<code>","message":"..","next_seq"?:N}`; Durable
//! Streams `{"error":{"code":"<CODE>","message":".."}}`. [`decode`] reads both.

/// What an error body says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorBody {
    pub code: Option<String>,
    pub message: Option<String>,
    /// Pico: the stream's next sequence, where the error is about it (`closed`, `match_failed`).
    pub next_seq: Option<u64>,
}

/// A Pico error body. An empty `message` is left out.
pub fn pico(code: &str, message: &str, next_seq: Option<u64>) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + message.len());
    body.extend_from_slice(b"{\"error\":");
    crate::json::string(&mut body, code);
    if !message.is_empty() {
        body.extend_from_slice(b",\"message\":");
        crate::json::string(&mut body, message);
    }
    if let Some(next) = next_seq {
        body.extend_from_slice(format!(",\"next_seq\":{next}").as_bytes());
    }
    body.push(b'}');
    body
}

/// A Durable Streams error body.
pub fn durable_streams(code: &str, message: &str) -> Vec<u8> {
    serde_json::json!({"error": {"code": code, "message": message}})
        .to_string()
        .into_bytes()
}

/// Reads an error body of either protocol; `None` when it is not JSON.
pub fn decode(body: &[u8]) -> Option<ErrorBody> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_owned);
    Some(match json.get("error") {
        Some(nested @ serde_json::Value::Object(_)) => ErrorBody {
            code: text(nested.get("code")),
            message: text(nested.get("message")),
            next_seq: None,
        },
        code => ErrorBody {
            code: text(code),
            message: text(json.get("message")),
            next_seq: json.get("next_seq").and_then(|v| v.as_u64()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_round_trip() {
        let pico_body = pico("closed", "stream is \"closed\"", Some(12));
        assert_eq!(
            decode(&pico_body),
            Some(ErrorBody {
                code: Some("closed".into()),
                message: Some("stream is \"closed\"".into()),
                next_seq: Some(12),
            })
        );
        assert_eq!(
            &pico("bad_request", "", None)[..],
            br#"{"error":"bad_request"}"#
        );
        let ds = durable_streams("STREAM_CLOSED", "stream is closed");
        assert_eq!(
            decode(&ds),
            Some(ErrorBody {
                code: Some("STREAM_CLOSED".into()),
                message: Some("stream is closed".into()),
                next_seq: None,
            })
        );
        assert_eq!(decode(b"<html>"), None);
        assert_eq!(decode(b"{}"), Some(ErrorBody::default()));
    }
}
