//! Reading answers: the status check that turns a refusal into [`ClientError::Api`], the
//! listing's JSON body, and the typed response headers.

use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, Response};

use crate::answers::{ListedStream, StreamList, DEFAULT_CONTENT_TYPE};
use crate::error::{ApiError, ClientError};
use crate::position::Position;
use pico_proto::header::*;

pub(crate) async fn send(request: RequestBuilder) -> Result<Response, ClientError> {
    check(request.send().await?).await
}

/// Passes 2xx through; turns anything else into [`ClientError::Api`].
pub(crate) async fn check(response: Response) -> Result<Response, ClientError> {
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    // The body is only the small JSON error; if even that fails, the status still speaks.
    let body = response.bytes().await.unwrap_or_default();
    Err(ApiError::from_response(status, &headers, &body).into())
}

/// The JSON body of `GET /`.
pub(crate) fn parse_list(body: &[u8]) -> Result<StreamList, ClientError> {
    let bad = |why: &str| ClientError::InvalidResponse(format!("stream listing: {why}"));
    let json: serde_json::Value = serde_json::from_slice(body).map_err(|_| bad("not JSON"))?;
    let entries = json
        .get("streams")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("no streams array"))?;
    let mut streams = Vec::with_capacity(entries.len());
    for entry in entries {
        let text = |name: &str| entry.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        let number = |name: &str| entry.get(name).and_then(|v| v.as_u64());
        streams.push(ListedStream {
            name: text("name").ok_or_else(|| bad("an entry without a name"))?,
            content_type: text("content_type").unwrap_or_else(|| DEFAULT_CONTENT_TYPE.into()),
            start: number("start_seq").ok_or_else(|| bad("an entry without start_seq"))?,
            next: number("next_seq").ok_or_else(|| bad("an entry without next_seq"))?,
            closed: entry
                .get("closed")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            ttl_secs: number("ttl"),
            expires_at: text("expires_at"),
            owner_node: number("owner_node"),
        });
    }
    let has_more = json
        .get("has_more")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    Ok(StreamList { streams, has_more })
}

pub(crate) fn text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

pub(crate) fn flag(headers: &HeaderMap, name: &str) -> bool {
    text(headers, name).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

pub(crate) fn optional_u64(headers: &HeaderMap, name: &str) -> Result<Option<u64>, ClientError> {
    text(headers, name)
        .map(|v| {
            v.parse()
                .map_err(|_| ClientError::InvalidResponse(format!("{name}: not a number: {v:?}")))
        })
        .transpose()
}

pub(crate) fn required_u64(headers: &HeaderMap, name: &str) -> Result<u64, ClientError> {
    optional_u64(headers, name)?
        .ok_or_else(|| ClientError::InvalidResponse(format!("missing {name} header")))
}

/// `Stream-Next-Offset`, which every successful Durable Streams answer but DELETE carries.
pub(crate) fn required_offset(headers: &HeaderMap) -> Result<Position, ClientError> {
    text(headers, STREAM_NEXT_OFFSET)
        .map(Position::Offset)
        .ok_or_else(|| ClientError::InvalidResponse("missing stream-next-offset header".into()))
}

/// `application/json`, whatever its parameters (`; charset=utf-8`) and case: the type whose
/// Durable Streams reads are JSON arrays.
pub(crate) fn is_json_type(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(pico_proto::media::JSON))
}

pub(crate) fn required_i64(headers: &HeaderMap, name: &str) -> Result<i64, ClientError> {
    let value = text(headers, name)
        .ok_or_else(|| ClientError::InvalidResponse(format!("missing {name} header")))?;
    value
        .parse()
        .map_err(|_| ClientError::InvalidResponse(format!("{name}: not a number: {value:?}")))
}
