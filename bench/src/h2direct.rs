//! The writers' HTTP/2 transport for `--http2` against an `http://` endpoint: the `h2` crate
//! directly, one connection per `--connections`, each shared by its writers.
//!
//! Why not reqwest: a profile of `pico --http2 bench -b 1024 -w 512 --connections 4 --streams 4`
//! put the load generator at about 1.2 of the machine's 2 CPUs, most of it in reqwest and
//! hyper's per-request machinery (client clones, pool checkout, boxed futures, retries policy),
//! leaving the node under test less than one. A request here is one `send_request` and one
//! `send_data` on an open connection.
//!
//! Used only where it measures the same thing: cleartext h2 (TLS and HTTP/1.1 stay on reqwest),
//! and streams served by the endpoint itself (a cluster redirecting them elsewhere keeps
//! reqwest, which follows `307`s).

use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, StatusCode};

/// Per-stream and per-connection receive windows: responses are small, but a large window
/// keeps the server from ever waiting on us.
const WINDOW_BYTES: u32 = 8 * 1024 * 1024;
/// Streams one connection may open at once (the server's limit applies too).
const MAX_CONCURRENT_STREAMS: u32 = 4096;

/// One open HTTP/2 connection; clones share it.
#[derive(Clone)]
pub(crate) struct H2Conn {
    send: SendRequest<Bytes>,
    authorization: Option<http::HeaderValue>,
}

/// `host:port` of an `http://` base URL; `None` for anything else (https, other schemes).
pub(crate) fn cleartext_authority(base: &str) -> Option<String> {
    let rest = base.strip_prefix("http://")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    (!authority.is_empty()).then(|| authority.to_string())
}

impl H2Conn {
    /// Connects with prior knowledge (h2c) and drives the connection on its own task.
    pub(crate) async fn connect(authority: &str, token: Option<&str>) -> Result<H2Conn, String> {
        let tcp = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(authority),
        )
        .await
        .map_err(|_| format!("connect to {authority}: timed out"))?
        .map_err(|e| format!("connect to {authority}: {e}"))?;
        tcp.set_nodelay(true)
            .map_err(|e| format!("connect to {authority}: {e}"))?;
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(WINDOW_BYTES)
            .initial_connection_window_size(WINDOW_BYTES)
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .handshake::<_, Bytes>(tcp)
            .await
            .map_err(|e| format!("HTTP/2 handshake with {authority}: {e}"))?;
        tokio::spawn(async move {
            // Ends when every handle is dropped or the server closes; errors surface in the
            // requests themselves.
            let _ = connection.await;
        });
        let authorization = match token {
            None => None,
            Some(token) => {
                let mut value = http::HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| "invalid token: it must be printable ASCII".to_string())?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(H2Conn {
            send,
            authorization,
        })
    }

    /// `POST url` with `body`; the response's status and body.
    pub(crate) async fn post(
        &self,
        url: &str,
        content_type: &'static str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), String> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(CONTENT_TYPE, content_type)
            // As other clients send it: the server sizes its body buffer from it.
            .header(CONTENT_LENGTH, body.len())
            .body(())
            .map_err(|e| format!("request to {url}: {e}"))?;
        if let Some(value) = &self.authorization {
            request.headers_mut().insert(AUTHORIZATION, value.clone());
        }
        let mut send = self
            .send
            .clone()
            .ready()
            .await
            .map_err(|e| format!("HTTP/2 connection: {e}"))?;
        let (response, mut stream) = send
            .send_request(request, false)
            .map_err(|e| format!("request to {url}: {e}"))?;
        // h2 queues what exceeds the peer's window and sends it as the window opens.
        stream
            .send_data(body, true)
            .map_err(|e| format!("request body to {url}: {e}"))?;
        let response = response
            .await
            .map_err(|e| format!("response from {url}: {e}"))?;
        let status = response.status();
        let mut body = response.into_body();
        let mut answer = bytes::BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| format!("response body from {url}: {e}"))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            answer.extend_from_slice(&chunk);
        }
        Ok((status, answer.freeze()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cleartext_endpoints_have_an_authority() {
        assert_eq!(
            cleartext_authority("http://127.0.0.1:4437"),
            Some("127.0.0.1:4437".into())
        );
        assert_eq!(
            cleartext_authority("http://node1:4437/"),
            Some("node1:4437".into())
        );
        assert_eq!(cleartext_authority("https://node1:4437"), None);
        assert_eq!(cleartext_authority("http://"), None);
    }
}
