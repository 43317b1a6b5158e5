//! The HTTP client: one method per stream operation, each taking the stream's path.
//!
//! Every operation dispatches on [`Protocol`]; only the Pico protocol is implemented so far,
//! the Durable Streams arms answer [`ClientError::Unsupported`]. Positions are Pico sequence
//! numbers (`u64`).

use std::sync::Once;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};

use crate::codec::{self, Record, BATCH_CONTENT_TYPE};
use crate::error::{ApiError, ClientError};

/// Default stream content type, as the server assumes without a `Content-Type`.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// The wire protocol spoken to the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// PicoMQ's native protocol (pico-protocol.md).
    #[default]
    Pico,
    /// The open Durable Streams protocol (durable-streams.md). Not implemented yet.
    Ds,
}

impl Protocol {
    /// The name used by `--protocol`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Pico => "pico",
            Protocol::Ds => "ds",
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Protocol, String> {
        match s.to_ascii_lowercase().as_str() {
            "pico" => Ok(Protocol::Pico),
            "ds" => Ok(Protocol::Ds),
            _ => Err(format!("unknown protocol {s:?}: expected pico or ds")),
        }
    }
}

/// How to reach the server.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Base URL; stream paths are appended to it (`http://127.0.0.1:4437` + `/streams/a`).
    pub endpoint: String,
    pub protocol: Protocol,
    /// Cleartext HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    pub http2_prior_knowledge: bool,
    pub connect_timeout: Duration,
    /// Whole-request limit for ordinary requests.
    pub request_timeout: Duration,
    /// Whole-request limit for long-polls: must exceed the server's long-poll timeout
    /// (25 s by default) plus network slack, or idle polls would fail as timeouts.
    pub long_poll_timeout: Duration,
    /// Sent as `Authorization: Bearer <token>` on every request (marked sensitive, so it
    /// never appears in debug output).
    pub token: Option<String>,
    /// Extra trusted root certificates (PEM, one or more) for `https://` endpoints, in
    /// addition to the platform's roots.
    pub ca_cert_pem: Option<Vec<u8>>,
}

impl ClientConfig {
    pub fn new(endpoint: impl Into<String>) -> ClientConfig {
        ClientConfig {
            endpoint: endpoint.into(),
            protocol: Protocol::Pico,
            http2_prior_knowledge: false,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(65),
            long_poll_timeout: Duration::from_secs(65),
            token: None,
            ca_cert_pem: None,
        }
    }
}

/// `HEAD` of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// First readable sequence (moves up with trims).
    pub start: u64,
    /// Durable tail: the sequence the next record will get.
    pub next: u64,
    pub closed: bool,
    pub content_type: Option<String>,
    /// Sliding idle expiry, seconds, if set.
    pub ttl_secs: Option<u64>,
    /// Absolute expiry (RFC 3339), if set.
    pub expires_at: Option<String>,
}

/// Acknowledgement of an append that wrote records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendAck {
    /// Sequence of the first record of the request.
    pub start: u64,
    /// Stream tail after the request.
    pub next: u64,
    /// Server timestamp (epoch ms) shared by all records of the request.
    pub timestamp: i64,
}

/// Answer to an idempotent producer's append ([`Client::append_as_producer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerAck {
    /// Sequence of the first record written; `None` for a duplicate (nothing was written).
    pub start: Option<u64>,
    /// Stream tail after the request.
    pub next: u64,
    /// Server timestamp of the records, if any were written.
    pub timestamp: Option<i64>,
    /// On a duplicate, the producer's highest accepted sequence; else the one sent.
    pub producer_seq: Option<u64>,
    /// The stream is closed.
    pub closed: bool,
}

impl ProducerAck {
    /// The server had already applied this request (or a later one of the producer).
    pub fn is_duplicate(&self) -> bool {
        self.start.is_none()
    }
}

/// One stream of a listing (`GET /`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedStream {
    pub name: String,
    pub content_type: String,
    pub start: u64,
    pub next: u64,
    pub closed: bool,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
}

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamList {
    pub streams: Vec<ListedStream>,
    /// More streams match: continue with `start_after` = the last name.
    pub has_more: bool,
}

/// One read response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadPage {
    pub records: Vec<Record>,
    /// Where to continue reading.
    pub next: u64,
    /// The page reaches the durable tail.
    pub up_to_date: bool,
    /// The stream is closed and the page reaches its end: nothing more will ever come.
    pub closed: bool,
    /// Long-poll cursor to echo in the next poll (`Pico-Cursor`).
    pub cursor: Option<String>,
}

/// A client for one server. Cheap to clone (the connection pool is shared).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    /// Endpoint without a trailing `/`, so stream paths can be appended.
    base: String,
    protocol: Protocol,
    long_poll_timeout: Duration,
}

static INSTALL_CRYPTO: Once = Once::new();

impl Client {
    pub fn new(config: ClientConfig) -> Result<Client, ClientError> {
        let base = config.endpoint.trim_end_matches('/').to_owned();
        let invalid = |why: String| {
            ClientError::InvalidArgument(format!(
                "invalid endpoint {:?}: {why}; expected http://HOST:PORT or https://HOST:PORT",
                config.endpoint
            ))
        };
        let url = Url::parse(&base).map_err(|e| invalid(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!("unsupported scheme {}", url.scheme())));
        }
        if !url.has_host() {
            return Err(invalid("no host".into()));
        }
        // reqwest is built without a default crypto provider; rustls needs one process-wide.
        // Another library may have installed one already, which is just as good.
        INSTALL_CRYPTO.call_once(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
        let mut builder = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout);
        if config.http2_prior_knowledge {
            builder = builder.http2_prior_knowledge();
        }
        if let Some(token) = &config.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ClientError::InvalidArgument(
                    "invalid token: it must be printable ASCII without line breaks".into(),
                )
            })?;
            value.set_sensitive(true);
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, value);
            builder = builder.default_headers(headers);
        }
        if let Some(pem) = &config.ca_cert_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
                ClientError::InvalidArgument(format!("invalid CA certificate: {e}"))
            })?;
            if certs.is_empty() {
                return Err(ClientError::InvalidArgument(
                    "invalid CA certificate: no PEM certificate found".into(),
                ));
            }
            builder = builder.tls_certs_merge(certs);
        }
        let http = builder.build().map_err(|e| {
            ClientError::InvalidArgument(format!("cannot build the HTTP client: {e}"))
        })?;
        Ok(Client {
            http,
            base,
            protocol: config.protocol,
            long_poll_timeout: config.long_poll_timeout,
        })
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The endpoint, without a trailing `/`.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    /// Creates a stream (idempotent). `Ok(true)` if it was created, `Ok(false)` if it already
    /// existed with the same configuration. `ttl_secs` is the sliding idle expiry.
    pub async fn create(
        &self,
        stream: &str,
        content_type: Option<&str>,
        ttl_secs: Option<u64>,
    ) -> Result<bool, ClientError> {
        self.require_pico()?;
        let mut request = self
            .request(Method::PUT, stream)?
            .header(CONTENT_TYPE, content_type.unwrap_or(DEFAULT_CONTENT_TYPE));
        if let Some(ttl) = ttl_secs {
            request = request.header("Pico-TTL", ttl.to_string());
        }
        let response = send(request).await?;
        Ok(response.status() == StatusCode::CREATED)
    }

    /// Stream metadata, `None` if the stream does not exist.
    pub async fn head(&self, stream: &str) -> Result<Option<StreamInfo>, ClientError> {
        self.require_pico()?;
        let response = self.request(Method::HEAD, stream)?.send().await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = check(response).await?;
        let headers = response.headers();
        Ok(Some(StreamInfo {
            start: required_u64(headers, "pico-start-seq")?,
            next: required_u64(headers, "pico-next-seq")?,
            closed: flag(headers, "pico-closed"),
            content_type: text(headers, "content-type"),
            ttl_secs: optional_u64(headers, "pico-ttl")?,
            expires_at: text(headers, "pico-expires-at"),
        }))
    }

    /// Appends records without headers as one binary batch: one request, atomic, contiguous.
    pub async fn append_binary_batch(
        &self,
        stream: &str,
        records: &[Bytes],
    ) -> Result<AppendAck, ClientError> {
        self.require_pico()?;
        let body = codec::encode_binary_batch(records)
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        self.append_body(stream, body, BATCH_CONTENT_TYPE).await
    }

    /// Appends records with headers as one binary batch.
    pub async fn append_records(
        &self,
        stream: &str,
        records: &[codec::NewRecord],
    ) -> Result<AppendAck, ClientError> {
        self.require_pico()?;
        let body = codec::encode_binary_batch_records(records)
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        self.append_body(stream, body, BATCH_CONTENT_TYPE).await
    }

    /// Appends `body` as one record. `content_type` is sent as is: with the Pico protocol
    /// any type other than the two batch types means "one raw record".
    pub async fn append_single(
        &self,
        stream: &str,
        body: Bytes,
        content_type: Option<&str>,
    ) -> Result<AppendAck, ClientError> {
        self.require_pico()?;
        self.append_body(stream, body, content_type.unwrap_or(DEFAULT_CONTENT_TYPE))
            .await
    }

    async fn append_body(
        &self,
        stream: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<AppendAck, ClientError> {
        let request = self
            .request(Method::POST, stream)?
            .header(CONTENT_TYPE, content_type)
            .body(body);
        let response = send(request).await?;
        let headers = response.headers();
        Ok(AppendAck {
            start: required_u64(headers, "pico-start-seq")?,
            next: required_u64(headers, "pico-next-seq")?,
            timestamp: required_i64(headers, "pico-timestamp")?,
        })
    }

    /// Appends an encoded binary batch (see [`codec::encode_binary_batch_records`]) as
    /// request `seq` of producer `producer_id` at `epoch` (pico-protocol.md §2.9.3). A
    /// duplicate is not an error: it answers with `start: None`.
    pub async fn append_as_producer(
        &self,
        stream: &str,
        batch: Bytes,
        producer_id: &str,
        epoch: u64,
        seq: u64,
    ) -> Result<ProducerAck, ClientError> {
        self.require_pico()?;
        let request = self
            .request(Method::POST, stream)?
            .header(CONTENT_TYPE, BATCH_CONTENT_TYPE)
            .header("Pico-Producer-Id", producer_id)
            .header("Pico-Producer-Epoch", epoch.to_string())
            .header("Pico-Producer-Seq", seq.to_string())
            .body(batch);
        let response = send(request).await?;
        let headers = response.headers();
        let start = optional_u64(headers, "pico-start-seq")?;
        Ok(ProducerAck {
            start,
            next: required_u64(headers, "pico-next-seq")?,
            timestamp: match start {
                Some(_) => Some(required_i64(headers, "pico-timestamp")?),
                None => None,
            },
            producer_seq: optional_u64(headers, "pico-producer-seq")?,
            closed: flag(headers, "pico-closed"),
        })
    }

    /// Trims the stream: records below `seq` become unreadable. Returns the new start
    /// (the request clamped to the tail).
    pub async fn trim(&self, stream: &str, seq: u64) -> Result<u64, ClientError> {
        self.require_pico_for("trim is a Pico protocol operation; use --protocol pico")?;
        let request = self
            .request(Method::POST, stream)?
            .header("Pico-Trim-Seq", seq.to_string())
            .header(CONTENT_LENGTH, "0");
        let response = send(request).await?;
        required_u64(response.headers(), "pico-start-seq")
    }

    /// One page of the stream listing: names starting with `prefix` (server default `/`)
    /// after `start_after`, at most `limit` (0 or `None`: the server's default, 1000).
    pub async fn list(
        &self,
        prefix: Option<&str>,
        start_after: Option<&str>,
        limit: Option<u64>,
    ) -> Result<StreamList, ClientError> {
        self.require_pico_for(
            "the Durable Streams protocol has no stream listing; use --protocol pico",
        )?;
        let mut url = Url::parse(&format!("{}/", self.base)).map_err(|e| {
            ClientError::InvalidArgument(format!("invalid endpoint {:?}: {e}", self.base))
        })?;
        let limit = limit.filter(|l| *l > 0).map(|l| l.to_string());
        let pairs = [
            ("prefix", prefix),
            ("start_after", start_after),
            ("limit", limit.as_deref()),
        ];
        if pairs.iter().any(|(_, v)| v.is_some()) {
            let mut query = url.query_pairs_mut();
            for (name, value) in pairs {
                if let Some(value) = value {
                    query.append_pair(name, value);
                }
            }
        }
        let response = send(self.http.get(url)).await?;
        let body = response.bytes().await?;
        parse_list(&body)
    }

    /// One catch-up read from `from` (binary format, the server's default page size).
    pub async fn read(&self, stream: &str, from: u64) -> Result<ReadPage, ClientError> {
        self.require_pico()?;
        let mut url = self.stream_url(stream)?;
        url.query_pairs_mut()
            .append_pair("seq", &from.to_string())
            .append_pair("format", "binary");
        read_page(self.http.get(url)).await
    }

    /// One long-poll from `from`: answers at once if records are there, else waits up to the
    /// server's long-poll timeout. A timeout (204) is an empty page with `up_to_date`.
    /// Pass the previous page's `cursor` back so successive polls have distinct URLs.
    pub async fn read_long_poll(
        &self,
        stream: &str,
        from: u64,
        cursor: Option<&str>,
    ) -> Result<ReadPage, ClientError> {
        self.require_pico()?;
        let mut url = self.stream_url(stream)?;
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("seq", &from.to_string())
                .append_pair("format", "binary")
                .append_pair("live", "long-poll");
            if let Some(cursor) = cursor {
                query.append_pair("cursor", cursor);
            }
        }
        read_page(self.http.get(url).timeout(self.long_poll_timeout)).await
    }

    /// Closes the stream (idempotent); returns its final tail.
    pub async fn close(&self, stream: &str) -> Result<u64, ClientError> {
        self.require_pico()?;
        let request = self
            .request(Method::POST, stream)?
            .header("Pico-Closed", "true");
        let response = send(request).await?;
        required_u64(response.headers(), "pico-next-seq")
    }

    /// Deletes the stream and its records. `Ok(false)` if it did not exist.
    pub async fn delete(&self, stream: &str) -> Result<bool, ClientError> {
        self.require_pico()?;
        let response = self.request(Method::DELETE, stream)?.send().await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        check(response).await?;
        Ok(true)
    }

    fn require_pico(&self) -> Result<(), ClientError> {
        self.require_pico_for(
            "the Durable Streams client is not supported yet; use --protocol pico",
        )
    }

    fn require_pico_for(&self, message: &str) -> Result<(), ClientError> {
        match self.protocol {
            Protocol::Pico => Ok(()),
            Protocol::Ds => Err(ClientError::Unsupported(message.into())),
        }
    }

    fn request(&self, method: Method, stream: &str) -> Result<RequestBuilder, ClientError> {
        Ok(self.http.request(method, self.stream_url(stream)?))
    }

    /// The stream's URL: endpoint + path. The server takes the path verbatim as the name;
    /// a missing leading `/` is added rather than producing `http://hoststream`.
    pub fn stream_url(&self, stream: &str) -> Result<Url, ClientError> {
        let slash = if stream.starts_with('/') { "" } else { "/" };
        let raw = format!("{}{slash}{stream}", self.base);
        Url::parse(&raw).map_err(|e| {
            ClientError::InvalidArgument(format!("invalid stream name {stream:?}: {e}"))
        })
    }
}

async fn send(request: RequestBuilder) -> Result<Response, ClientError> {
    check(request.send().await?).await
}

/// Passes 2xx through; turns anything else into [`ClientError::Api`].
async fn check(response: Response) -> Result<Response, ClientError> {
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    // The body is only the small JSON error; if even that fails, the status still speaks.
    let body = response.bytes().await.unwrap_or_default();
    Err(ApiError::from_response(status, &headers, &body).into())
}

async fn read_page(request: RequestBuilder) -> Result<ReadPage, ClientError> {
    let response = send(request).await?;
    let headers = response.headers().clone();
    let next = required_u64(&headers, "pico-next-seq")?;
    let up_to_date = flag(&headers, "pico-up-to-date");
    let closed = flag(&headers, "pico-closed");
    let cursor = text(&headers, "pico-cursor");
    let no_content = response.status() == StatusCode::NO_CONTENT;
    let records = if no_content {
        Vec::new()
    } else {
        let body = response.bytes().await?;
        codec::decode_read_page(&body)
            .map_err(|e| ClientError::InvalidResponse(format!("binary read body: {e}")))?
    };
    Ok(ReadPage {
        records,
        next,
        // A 204 only happens at the tail; say so even if a server forgot the header.
        up_to_date: up_to_date || no_content,
        closed,
        cursor,
    })
}

/// The JSON body of `GET /`.
fn parse_list(body: &[u8]) -> Result<StreamList, ClientError> {
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
        });
    }
    let has_more = json
        .get("has_more")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    Ok(StreamList { streams, has_more })
}

fn text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

fn flag(headers: &HeaderMap, name: &str) -> bool {
    text(headers, name).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

fn optional_u64(headers: &HeaderMap, name: &str) -> Result<Option<u64>, ClientError> {
    text(headers, name)
        .map(|v| {
            v.parse()
                .map_err(|_| ClientError::InvalidResponse(format!("{name}: not a number: {v:?}")))
        })
        .transpose()
}

fn required_u64(headers: &HeaderMap, name: &str) -> Result<u64, ClientError> {
    optional_u64(headers, name)?
        .ok_or_else(|| ClientError::InvalidResponse(format!("missing {name} header")))
}

fn required_i64(headers: &HeaderMap, name: &str) -> Result<i64, ClientError> {
    let value = text(headers, name)
        .ok_or_else(|| ClientError::InvalidResponse(format!("missing {name} header")))?;
    value
        .parse()
        .map_err(|_| ClientError::InvalidResponse(format!("{name}: not a number: {value:?}")))
}
