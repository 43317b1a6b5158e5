//! A request of one protocol sent to the other protocol's listener is refused, never half
//! served: the Pico handlers would ignore `Producer-*` (a retried idempotent append written
//! twice) and `?offset=` (every read from 0), the Durable Streams handlers `Pico-*` and
//! `?seq=`. The `400` says where the node serves the protocol the request was written for
//! (docs/api.md, "Wrong protocol").

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use crate::transport::message::Request;

/// Where this node serves the other protocol: set once, when core 0 has bound its listeners
/// (`--ds-listen 127.0.0.1:0` picks its port then), and read by every core's handlers.
#[derive(Clone, Debug, Default)]
pub struct OtherListener(Arc<OnceLock<(&'static str, SocketAddr)>>);

impl OtherListener {
    /// Records the listener's scheme and bound address; the first call wins (every core binds
    /// the address core 0 resolved).
    pub fn set(&self, scheme: &'static str, addr: SocketAddr) {
        let _ = self.0.set((scheme, addr));
    }

    /// The other listener's base URL as this request's client can reach it: a listener bound
    /// to every address (`0.0.0.0`, `[::]`) is named by the host the client used, with its own
    /// port. `None` when the node has no such listener.
    pub fn url(&self, request: &Request) -> Option<String> {
        let (scheme, addr) = *self.0.get()?;
        if !addr.ip().is_unspecified() {
            return Some(format!("{scheme}://{addr}"));
        }
        let host = request
            .header("host")
            .map(host_without_port)
            .filter(|h| !h.is_empty())
            .unwrap_or("127.0.0.1");
        Some(format!("{scheme}://{host}:{}", addr.port()))
    }
}

/// `example.com:4437` → `example.com`, `[::1]:4437` → `[::1]`, `example.com` as it is.
fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Query parameters only the Durable Streams protocol has (`live` and `cursor` both have).
const DS_ONLY_PARAMS: &[&str] = &["offset"];
/// Query parameters only the Pico protocol has, that its client sends on every read.
const PICO_ONLY_PARAMS: &[&str] = &["seq"];

/// What in a request sent to a Pico listener belongs to Durable Streams: a `Stream-*` or
/// `Producer-*` header (the Pico protocol has none) or an `offset` query parameter, as
/// "the header Producer-Id" or "the query parameter offset". CORS preflights are let through.
pub fn durable_streams_only(request: &Request) -> Option<String> {
    if request.method == "OPTIONS" {
        return None;
    }
    let header = request
        .headers
        .iter()
        .map(|(name, _)| name.as_str())
        .find(|name| name.starts_with("stream-") || name.starts_with("producer-"));
    if let Some(name) = header {
        return Some(format!("the header {}", display_name(name)));
    }
    query_key(&request.query, DS_ONLY_PARAMS).map(|key| format!("the query parameter {key}"))
}

/// What in a request sent to a Durable Streams listener belongs to the Pico protocol: a
/// `Pico-*` header or a `seq` query parameter. CORS preflights are let through.
pub fn pico_only(request: &Request) -> Option<String> {
    if request.method == "OPTIONS" {
        return None;
    }
    let header = request
        .headers
        .iter()
        .map(|(name, _)| name.as_str())
        .find(|name| name.starts_with("pico-"));
    if let Some(name) = header {
        return Some(format!("the header {}", display_name(name)));
    }
    query_key(&request.query, PICO_ONLY_PARAMS).map(|key| format!("the query parameter {key}"))
}

/// The message of the `400` a Pico listener answers a Durable Streams request with.
pub fn on_pico_listener(what: &str, durable_streams: Option<String>) -> String {
    let hint = if what.contains("Producer-") {
        " (the Pico protocol's idempotent producer headers are Pico-Producer-Id, -Epoch and -Seq)"
    } else {
        ""
    };
    match durable_streams {
        Some(url) => format!(
            "{what} is Durable Streams protocol, but this listener speaks the Pico protocol \
             and would ignore it{hint}; this node serves Durable Streams at {url}"
        ),
        None => format!(
            "{what} is Durable Streams protocol, but this listener speaks the Pico protocol \
             and would ignore it{hint}; this node has no Durable Streams listener \
             (pico serve --ds-listen ADDR starts one)"
        ),
    }
}

/// The message of the `400` a Durable Streams listener answers a Pico request with.
pub fn on_durable_streams_listener(what: &str, pico: Option<String>) -> String {
    match pico {
        Some(url) => format!(
            "{what} is Pico protocol, but this listener speaks Durable Streams and would \
             ignore it; this node serves the Pico protocol at {url}"
        ),
        None => format!(
            "{what} is Pico protocol, but this listener speaks Durable Streams and would \
             ignore it; this node has no Pico listener"
        ),
    }
}

fn query_key<'a>(query: &str, keys: &[&'a str]) -> Option<&'a str> {
    let present: Vec<_> = form_urlencoded::parse(query.as_bytes())
        .map(|(k, _)| k)
        .collect();
    keys.iter()
        .copied()
        .find(|key| present.iter().any(|k| k == key))
}

/// `producer-id` → `Producer-Id`, `stream-ttl` → `Stream-TTL`, as the protocols write their
/// headers.
fn display_name(lowercase: &str) -> String {
    let words: Vec<String> = lowercase
        .split('-')
        .map(|word| match word {
            "ttl" => "TTL".to_string(),
            _ => {
                let mut chars = word.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            }
        })
        .collect();
    words.join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, query: &str, headers: &[(&str, &str)]) -> Request {
        Request {
            method: method.into(),
            path: "/s".into(),
            query: query.into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), bytes::Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
            body: bytes::Bytes::new(),
        }
    }

    #[test]
    fn each_protocol_knows_the_other_ones_marks() {
        let ds = request("POST", "", &[("producer-id", "w"), ("content-type", "a/b")]);
        assert_eq!(
            durable_streams_only(&ds).as_deref(),
            Some("the header Producer-Id")
        );
        assert_eq!(pico_only(&ds), None);
        let read = request("GET", "offset=-1&live=sse", &[]);
        assert_eq!(
            durable_streams_only(&read).as_deref(),
            Some("the query parameter offset")
        );
        let pico = request("GET", "seq=0&live=long-poll&cursor=3", &[]);
        assert_eq!(durable_streams_only(&pico), None);
        assert_eq!(pico_only(&pico).as_deref(), Some("the query parameter seq"));
        let pico = request("POST", "", &[("pico-producer-seq", "1")]);
        assert_eq!(
            pico_only(&pico).as_deref(),
            Some("the header Pico-Producer-Seq")
        );
        let preflight = request("OPTIONS", "offset=1", &[("stream-seq", "1")]);
        assert_eq!(durable_streams_only(&preflight), None);
    }

    #[test]
    fn a_wildcard_listener_is_named_by_the_host_the_client_used() {
        let other = OtherListener::default();
        let plain = request("GET", "", &[("host", "node1.internal:4437")]);
        assert_eq!(other.url(&plain), None);
        other.set("http", "0.0.0.0:4438".parse().unwrap());
        assert_eq!(
            other.url(&plain).as_deref(),
            Some("http://node1.internal:4438")
        );
        let v6 = request("GET", "", &[("host", "[::1]:4437")]);
        assert_eq!(other.url(&v6).as_deref(), Some("http://[::1]:4438"));
        let bound = OtherListener::default();
        bound.set("https", "127.0.0.1:9".parse().unwrap());
        assert_eq!(bound.url(&plain).as_deref(), Some("https://127.0.0.1:9"));
    }
}
