//! The HTTP client: one method per stream operation, each taking the stream's path.
//!
//! Every operation dispatches on [`Protocol`]. Positions are [`Position`]s: Pico sequence
//! numbers or Durable Streams offsets. Operations one protocol lacks (Pico's binary batches,
//! producers, trims and listings) answer [`ClientError::Unsupported`] under the other.

use pico_proto::header::*;
use std::sync::Once;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, StatusCode, Url};

use crate::answers::{
    AppendAck, ProducerAck, ReadPage, Retention, StreamInfo, StreamList, DEFAULT_CONTENT_TYPE,
};
use crate::codec::{self, BATCH_CONTENT_TYPE};
use crate::error::ClientError;
use crate::parse::{
    check, flag, is_json_type, optional_u64, parse_list, required_i64, required_offset,
    required_u64, send, send_following, text,
};
use crate::position::Position;

pub use pico_proto::Protocol;

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

/// The HTTP client setup every PicoMQ client shares (the stream client and `pico admin`):
/// the endpoint checked and stripped of its trailing `/`, the crypto provider installed,
/// timeouts, h2c, the bearer token and extra CA roots. `endpoint_name` names the endpoint in
/// errors (`endpoint`, `--admin-endpoint`). The caller builds the client.
pub fn http_client_builder(
    config: &ClientConfig,
    endpoint_name: &str,
) -> Result<(String, reqwest::ClientBuilder), ClientError> {
    builder_with_roots(config, endpoint_name, true)
}

/// Builds the HTTP client of [`http_client_builder`]. A machine without a system CA store
/// (no `ca-certificates`) makes the system verifier fail to load: the client is then built
/// with the `--ca-cert` roots alone (none without one), so `http://` endpoints and `https://`
/// ones signed by the given CA still work, and any other `https://` endpoint is refused when
/// it is reached, saying why.
pub fn build_http_client(
    config: &ClientConfig,
    endpoint_name: &str,
) -> Result<(String, reqwest::Client), ClientError> {
    let (base, builder) = builder_with_roots(config, endpoint_name, true)?;
    match builder.build() {
        Ok(client) => Ok((base, client)),
        Err(system) => {
            let (base, builder) = builder_with_roots(config, endpoint_name, false)?;
            let client = builder.build().map_err(|e| {
                ClientError::InvalidArgument(format!("cannot build the HTTP client: {e}"))
            })?;
            if base.starts_with("https://") && config.ca_cert_pem.is_none() {
                return Err(ClientError::InvalidArgument(format!(
                    "no CA certificates to check {base} with: the system's could not be loaded \
                     ({system}); install them (Debian: ca-certificates) or pass --ca-cert FILE"
                )));
            }
            Ok((base, client))
        }
    }
}

fn builder_with_roots(
    config: &ClientConfig,
    endpoint_name: &str,
    system_roots: bool,
) -> Result<(String, reqwest::ClientBuilder), ClientError> {
    let base = config.endpoint.trim_end_matches('/').to_owned();
    let invalid = |why: String| {
        ClientError::InvalidArgument(format!(
            "invalid {endpoint_name} {:?}: {why}; expected http://HOST:PORT or https://HOST:PORT",
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
    // Redirects are followed by `parse::send_following`, which keeps the bearer token.
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
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
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| ClientError::InvalidArgument(format!("invalid CA certificate: {e}")))?;
        if certs.is_empty() {
            return Err(ClientError::InvalidArgument(
                "invalid CA certificate: no PEM certificate found".into(),
            ));
        }
        builder = if system_roots {
            builder.tls_certs_merge(certs)
        } else {
            builder.tls_certs_only(certs)
        };
    } else if !system_roots {
        builder = builder.tls_certs_only(Vec::new());
    }
    Ok((base, builder))
}

impl Client {
    pub fn new(config: ClientConfig) -> Result<Client, ClientError> {
        let (base, http) = build_http_client(&config, "endpoint")?;
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

    /// Where a read of the whole stream starts: `-1` in both protocols, the first record the
    /// stream still has (after a Pico trim, sequence 0 is gone but `-1` is not).
    pub fn beginning(&self) -> Position {
        Position::ds_beginning()
    }

    /// Creates a stream (idempotent). `Ok(true)` if it was created, `Ok(false)` if it already
    /// existed with the same configuration. `ttl_secs` is the sliding idle expiry.
    pub async fn create(
        &self,
        stream: &str,
        content_type: Option<&str>,
        ttl_secs: Option<u64>,
    ) -> Result<bool, ClientError> {
        self.create_retained(stream, content_type, ttl_secs, &Retention::default())
            .await
    }

    /// [`Client::create`] with a retention policy (Pico protocol; each limit left `None`
    /// takes the server's default, `Some(0)` turns it off). A stream that already exists
    /// keeps its policy: [`Client::set_retention`] changes it.
    pub async fn create_retained(
        &self,
        stream: &str,
        content_type: Option<&str>,
        ttl_secs: Option<u64>,
        retention: &Retention,
    ) -> Result<bool, ClientError> {
        if !retention.is_empty() {
            self.require_pico_for(
                "the Durable Streams protocol has no retention headers; use --protocol pico",
            )?;
        }
        let mut request = retention.headers(
            self.request(Method::PUT, stream)?
                .header(CONTENT_TYPE, content_type.unwrap_or(DEFAULT_CONTENT_TYPE)),
        );
        if let Some(ttl) = ttl_secs {
            let name = match self.protocol {
                Protocol::Pico => "Pico-TTL",
                Protocol::DurableStreams => "Stream-TTL",
            };
            request = request.header(name, ttl.to_string());
        }
        let response = send(request).await?;
        Ok(response.status() == StatusCode::CREATED)
    }

    /// Stream metadata, `None` if the stream does not exist.
    pub async fn head(&self, stream: &str) -> Result<Option<StreamInfo>, ClientError> {
        let response = send_following(self.request(Method::HEAD, stream)?).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = check(response).await?;
        let headers = response.headers();
        let content_type = text(headers, "content-type");
        Ok(Some(match self.protocol {
            Protocol::Pico => StreamInfo {
                start: Position::Seq(required_u64(headers, PICO_START_SEQ)?),
                next: Position::Seq(required_u64(headers, PICO_NEXT_SEQ)?),
                closed: flag(headers, PICO_CLOSED),
                content_type,
                ttl_secs: optional_u64(headers, PICO_TTL)?,
                expires_at: text(headers, PICO_EXPIRES_AT),
            },
            Protocol::DurableStreams => StreamInfo {
                start: Position::ds_beginning(),
                next: required_offset(headers)?,
                closed: flag(headers, STREAM_CLOSED),
                content_type,
                ttl_secs: optional_u64(headers, STREAM_TTL)?,
                expires_at: text(headers, STREAM_EXPIRES_AT),
            },
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
    /// any type other than the two batch types means "one raw record"; Durable Streams
    /// requires the stream's type (and, on a JSON stream, stores each element of a
    /// top-level array as a message).
    pub async fn append_single(
        &self,
        stream: &str,
        body: Bytes,
        content_type: Option<&str>,
    ) -> Result<AppendAck, ClientError> {
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
        Ok(match self.protocol {
            Protocol::Pico => AppendAck {
                start: Position::Seq(required_u64(headers, PICO_START_SEQ)?),
                next: Position::Seq(required_u64(headers, PICO_NEXT_SEQ)?),
                timestamp: Some(required_i64(headers, PICO_TIMESTAMP)?),
            },
            Protocol::DurableStreams => {
                let next = required_offset(headers)?;
                AppendAck {
                    start: next.clone(),
                    next,
                    timestamp: None,
                }
            }
        })
    }

    /// Appends an encoded binary batch (see [`codec::encode_binary_batch_records`]) as
    /// request `seq` of producer `producer_id` at `epoch` (docs/api.md, "Append"). A
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
        let start = optional_u64(headers, PICO_START_SEQ)?;
        Ok(ProducerAck {
            start,
            next: required_u64(headers, PICO_NEXT_SEQ)?,
            timestamp: match start {
                Some(_) => Some(required_i64(headers, PICO_TIMESTAMP)?),
                None => None,
            },
            producer_seq: optional_u64(headers, PICO_PRODUCER_SEQ)?,
            closed: flag(headers, PICO_CLOSED),
        })
    }

    /// Trims the stream: records below `seq` become unreadable. Returns the new start
    /// (the request clamped to the tail).
    /// Changes the limits `retention` names (`Some(0)`: off), keeps the others; the policy
    /// after the change (Pico protocol). With no limit named it only reads the policy.
    pub async fn set_retention(
        &self,
        stream: &str,
        retention: &Retention,
    ) -> Result<Retention, ClientError> {
        self.require_pico_for("retention is a Pico protocol feature; use --protocol pico")?;
        let request = retention.headers(
            self.request(Method::PATCH, stream)?
                .header(CONTENT_LENGTH, "0"),
        );
        let response = send(request).await?;
        let headers = response.headers();
        let limit = |name: &str| text(headers, name).and_then(|v| v.parse::<u64>().ok());
        Ok(Retention {
            age_secs: limit(PICO_RETENTION_AGE),
            bytes: limit(PICO_RETENTION_BYTES),
            delete_on_empty_secs: limit(PICO_DELETE_ON_EMPTY),
        })
    }

    pub async fn trim(&self, stream: &str, seq: u64) -> Result<u64, ClientError> {
        self.require_pico_for("trim is a Pico protocol operation; use --protocol pico")?;
        let request = self
            .request(Method::POST, stream)?
            .header("Pico-Trim-Seq", seq.to_string())
            .header(CONTENT_LENGTH, "0");
        let response = send(request).await?;
        required_u64(response.headers(), PICO_START_SEQ)
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

    /// One catch-up read from `from` (Pico: binary format, the server's default page size;
    /// Durable Streams: one chunk of the server's chunk size).
    pub async fn read(
        &self,
        stream: &str,
        from: impl Into<Position>,
    ) -> Result<ReadPage, ClientError> {
        let url = self.read_url(stream, &from.into(), None)?;
        self.read_page(self.http.get(url)).await
    }

    /// One catch-up read from `from` of at most `count` records (Pico; Durable Streams has no
    /// record count and reads a chunk as [`Client::read`] does).
    pub async fn read_at_most(
        &self,
        stream: &str,
        from: impl Into<Position>,
        count: u64,
    ) -> Result<ReadPage, ClientError> {
        let mut url = self.read_url(stream, &from.into(), None)?;
        if self.protocol == Protocol::Pico {
            url.query_pairs_mut()
                .append_pair("count", &count.to_string());
        }
        self.read_page(self.http.get(url)).await
    }

    /// One long-poll from `from`: answers at once if records are there, else waits up to the
    /// server's long-poll timeout. A timeout (204) is an empty page with `up_to_date`.
    /// Pass the previous page's `cursor` back so successive polls have distinct URLs.
    pub async fn read_long_poll(
        &self,
        stream: &str,
        from: impl Into<Position>,
        cursor: Option<&str>,
    ) -> Result<ReadPage, ClientError> {
        let url = self.read_url(stream, &from.into(), Some(cursor))?;
        self.read_page(self.http.get(url).timeout(self.long_poll_timeout))
            .await
    }

    /// The URL of a read; `live` is `Some(cursor)` for a long-poll.
    fn read_url(
        &self,
        stream: &str,
        from: &Position,
        live: Option<Option<&str>>,
    ) -> Result<Url, ClientError> {
        let mut url = self.stream_url(stream)?;
        {
            let mut query = url.query_pairs_mut();
            match (self.protocol, from) {
                (Protocol::Pico, Position::Seq(seq)) => query
                    .append_pair("seq", &seq.to_string())
                    .append_pair("format", "binary"),
                (Protocol::DurableStreams, Position::Offset(offset)) => query.append_pair("offset", offset),
                // `-1` is the beginning in both protocols; a trimmed Pico stream starts at its
                // first readable record, where an explicit `seq=0` would be gone (410).
                (Protocol::Pico, Position::Offset(offset)) if offset == Position::DS_BEGINNING => {
                    query
                        .append_pair("seq", Position::DS_BEGINNING)
                        .append_pair("format", "binary")
                }
                (Protocol::Pico, Position::Offset(offset)) => {
                    return Err(ClientError::InvalidArgument(format!(
                        "{offset:?} is a Durable Streams offset; the Pico protocol reads from a sequence number"
                    )))
                }
                (Protocol::DurableStreams, Position::Seq(seq)) => {
                    return Err(ClientError::InvalidArgument(format!(
                        "sequence {seq} is a Pico position; the Durable Streams protocol reads from an offset (-1, now or one the server returned)"
                    )))
                }
            };
            if let Some(cursor) = live {
                query.append_pair("live", "long-poll");
                if let Some(cursor) = cursor {
                    query.append_pair("cursor", cursor);
                }
            }
        }
        Ok(url)
    }

    async fn read_page(&self, request: RequestBuilder) -> Result<ReadPage, ClientError> {
        let response = send(request).await?;
        let headers = response.headers().clone();
        // A 204 only happens at the tail; say so even if a server forgot the header.
        let no_content = response.status() == StatusCode::NO_CONTENT;
        let body = if no_content {
            Bytes::new()
        } else {
            response.bytes().await?
        };
        match self.protocol {
            Protocol::Pico => Ok(ReadPage {
                records: if no_content {
                    Vec::new()
                } else {
                    codec::decode_read_page(&body).map_err(|e| {
                        ClientError::InvalidResponse(format!("binary read body: {e}"))
                    })?
                },
                chunk: None,
                next: Position::Seq(required_u64(&headers, PICO_NEXT_SEQ)?),
                up_to_date: flag(&headers, PICO_UP_TO_DATE) || no_content,
                closed: flag(&headers, PICO_CLOSED),
                cursor: text(&headers, PICO_CURSOR),
            }),
            Protocol::DurableStreams => {
                let json = text(&headers, "content-type").is_some_and(|t| is_json_type(&t));
                // An empty JSON array is an empty chunk too: no message to show.
                let empty = body.is_empty() || (json && body.trim_ascii() == b"[]");
                Ok(ReadPage {
                    records: Vec::new(),
                    chunk: (!empty).then_some(body),
                    next: required_offset(&headers)?,
                    up_to_date: flag(&headers, STREAM_UP_TO_DATE) || no_content,
                    closed: flag(&headers, STREAM_CLOSED),
                    cursor: text(&headers, STREAM_CURSOR),
                })
            }
        }
    }

    /// Closes the stream (idempotent); returns its final tail.
    pub async fn close(&self, stream: &str) -> Result<Position, ClientError> {
        let header = match self.protocol {
            Protocol::Pico => "Pico-Closed",
            Protocol::DurableStreams => "Stream-Closed",
        };
        let request = self.request(Method::POST, stream)?.header(header, "true");
        let response = send(request).await?;
        let headers = response.headers();
        match self.protocol {
            Protocol::Pico => Ok(Position::Seq(required_u64(headers, PICO_NEXT_SEQ)?)),
            Protocol::DurableStreams => required_offset(headers),
        }
    }

    /// Deletes the stream and its records. `Ok(false)` if it did not exist.
    pub async fn delete(&self, stream: &str) -> Result<bool, ClientError> {
        let response = send_following(self.request(Method::DELETE, stream)?).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        check(response).await?;
        Ok(true)
    }

    fn require_pico(&self) -> Result<(), ClientError> {
        self.require_pico_for(
            "binary batches and producers are Pico protocol operations; use --protocol pico",
        )
    }

    /// The HTTP client every request of this client goes through.
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn require_pico_for(&self, message: &str) -> Result<(), ClientError> {
        match self.protocol {
            Protocol::Pico => Ok(()),
            Protocol::DurableStreams => Err(ClientError::Unsupported(message.into())),
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
