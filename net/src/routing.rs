//! Cluster routing answers shared by both protocols (docs/cluster.md, "Routing").
//!
//! The engine decides who serves a stream and says so with [`EngineError::Moved`] (the
//! owner's advertised base URL); the protocol's error mapping turns that into a `307` whose
//! `Location` is only the base, and [`complete_redirect`] appends the request's own path and
//! query, which only the HTTP layer knows.

use crate::transport::message::{Request, Response};

/// The status of an ownership redirect: method and body are replayed by the client.
pub const REDIRECT_STATUS: u16 = 307;

/// Finishes a `307` answer: `Location: <owner base URL><path>[?<query>]`, `Cache-Control:
/// no-store`, and an empty body (docs/cluster.md, "Routing").
pub fn complete_redirect(response: &mut Response, request: &Request) {
    if response.status != REDIRECT_STATUS {
        return;
    }
    if let Some((_, location)) = response.headers.iter_mut().find(|(n, _)| *n == "location") {
        let location = location.to_mut();
        location.push_str(&request.path);
        if !request.query.is_empty() {
            location.push('?');
            location.push_str(&request.query);
        }
    }
    response.headers.retain(|(n, _)| *n != "content-type");
    response.clear_body();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_location_keeps_path_and_query() {
        let request = Request {
            method: "GET".into(),
            path: "/logs/a".into(),
            query: "offset=3&live=sse".into(),
            headers: Vec::new(),
            body: bytes::Bytes::new(),
        };
        let mut response = Response::new(307)
            .header("location", "http://127.0.0.1:9")
            .header("content-type", "application/json")
            .with_body("{}");
        complete_redirect(&mut response, &request);
        let location = response.headers.iter().find(|(n, _)| *n == "location");
        assert_eq!(
            location.map(|(_, v)| v.as_ref()),
            Some("http://127.0.0.1:9/logs/a?offset=3&live=sse")
        );
        assert_eq!(response.body_len(), 0);
        let mut ok = Response::new(200).header("location", "/x");
        complete_redirect(&mut ok, &request);
        assert_eq!(ok.headers[0].1, "/x");
    }
}
