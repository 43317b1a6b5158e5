//! Reading answers: the status check that turns a refusal into [`ClientError::Api`], the
//! listing's JSON body, and the typed response headers.

use reqwest::header::{HeaderMap, LOCATION};
use reqwest::{RequestBuilder, Response, StatusCode};

use crate::answers::{ListedStream, StreamList, DEFAULT_CONTENT_TYPE};
use crate::error::{ApiError, ClientError};
use crate::position::Position;
use pico_proto::header::*;

/// Redirects followed per request: a cluster answers with one (to the node that serves the
/// stream), a takeover meanwhile with another.
const REDIRECTS_MAX: usize = 5;

/// Sends `request` and passes 2xx through ([`check`]).
pub(crate) async fn send(request: RequestBuilder) -> Result<Response, ClientError> {
    check(send_following(request).await?).await
}

/// Sends `request`, following a cluster's `307`/`308` to the node that serves the stream with
/// the same method, body and headers, the bearer token included: the redirect comes from a
/// node of the cluster the endpoint belongs to, trusted with the token already, and the node
/// it names checks the same grants. (HTTP clients drop `Authorization` on a redirect to
/// another host, which made every authorized request through a node that does not serve the
/// stream fail with `401`.) A redirect from `https` to `http` is refused rather than followed,
/// so the token never travels in clear; a body that cannot be sent twice (a stream) is not
/// redirected: the `307` is the answer.
pub(crate) async fn send_following(request: RequestBuilder) -> Result<Response, ClientError> {
    let (client, request) = request.build_split();
    let mut request = request?;
    for _ in 0..=REDIRECTS_MAX {
        let again = request.try_clone();
        let response = client.execute(request).await?;
        if !matches!(
            response.status(),
            StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
        ) {
            return Ok(response);
        }
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|l| l.to_str().ok());
        let (Some(mut next), Some(location)) = (again, location) else {
            return Ok(response);
        };
        let target = next.url().join(location).map_err(|e| {
            ClientError::InvalidResponse(format!("a redirect to {location:?}: {e}"))
        })?;
        if next.url().scheme() == "https" && target.scheme() != "https" {
            return Err(ClientError::InvalidResponse(format!(
                "refusing to follow a redirect from {} to {target}: the token would travel in clear",
                next.url()
            )));
        }
        *next.url_mut() = target;
        request = next;
    }
    Err(ClientError::InvalidResponse(format!(
        "more than {REDIRECTS_MAX} redirects"
    )))
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
