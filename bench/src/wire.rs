//! The bits of the protocols the bench speaks directly: Pico binary batches, binary read
//! pages and SSE events, Durable Streams append bodies, and HTTP error texts.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};

use crate::Connection;

/// `Content-Type` of binary batches (appends) and binary read pages.
pub(crate) const BATCH_CONTENT_TYPE: &str = pico_proto::media::BATCH;

/// Whole-request limit of writers and catch-up readers.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest read page the readers ask for.
pub(crate) const READ_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// A binary batch of `records` zero-filled records of `size` bytes without headers.
pub(crate) fn encode_batch(records: usize, size: usize) -> Bytes {
    let mut batch = pico_proto::batch::BatchWriter::with_capacity(records * (8 + size));
    batch
        .zeroed_records(records, size)
        .expect("--record-size and --batch are bounded far below 4 GiB and 2^32 records");
    batch.finish()
}

/// Type of the streams the bench creates, except Durable Streams JSON streams.
pub(crate) const OCTET_STREAM: &str = pico_proto::media::OCTET_STREAM;
/// Type of Durable Streams bench streams with `--batch` > 1.
pub(crate) const JSON_TYPE: &str = pico_proto::media::JSON;

/// How one append request of a run looks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AppendShape {
    /// The type the streams are created with.
    pub stream_type: &'static str,
    /// The `Content-Type` of every append.
    pub content_type: &'static str,
    pub body: Bytes,
    /// The status of a successful append: Pico answers 200, a plain Durable Streams
    /// append 204.
    pub ok: reqwest::StatusCode,
}

impl AppendShape {
    /// Pico: `records` zero-filled records as one binary batch on an octet-stream stream.
    pub(crate) fn pico(records: usize, size: usize) -> AppendShape {
        AppendShape {
            stream_type: OCTET_STREAM,
            content_type: BATCH_CONTENT_TYPE,
            body: encode_batch(records, size),
            ok: reqwest::StatusCode::OK,
        }
    }

    /// Durable Streams: one message of `size` `x` bytes; or, for more than one, a JSON array
    /// of `records` strings of `size − 2` `x` (each element, quotes included, is `size`
    /// bytes) on a JSON stream, which stores every element as a message.
    pub(crate) fn ds(records: usize, size: usize) -> AppendShape {
        let (stream_type, body) = if records == 1 {
            (OCTET_STREAM, vec![b'x'; size])
        } else {
            let element = format!("\"{}\"", "x".repeat(size.saturating_sub(2)));
            (
                JSON_TYPE,
                format!("[{}]", vec![element; records].join(",")).into_bytes(),
            )
        };
        AppendShape {
            stream_type,
            content_type: stream_type,
            body: Bytes::from(body),
            ok: reqwest::StatusCode::NO_CONTENT,
        }
    }
}

/// Records and record bytes in a Durable Streams read chunk of a bench stream written with
/// [`AppendShape::ds`]. On a JSON stream the chunk is `[e,e,…]` with `size`-byte elements:
/// `n · (size + 1) + 1` bytes. An octet-stream chunk is bodies back to back: only its bytes
/// are known here (whole records are counted by the reader over all chunks).
pub(crate) fn ds_json_chunk_records(len: usize, size: usize) -> u64 {
    if len <= 2 {
        return 0;
    }
    ((len - 1) / (size + 1)) as u64
}

/// What a binary read page held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PageStats {
    pub records: u64,
    /// Sum of the record bodies.
    pub body_bytes: u64,
    /// Sequence of every record (only when asked for).
    pub seqs: Vec<u64>,
}

/// Walks a binary read page ([`pico_proto::page`]).
pub(crate) fn parse_page(buf: &Bytes, want_seqs: bool) -> Result<PageStats, String> {
    let records = pico_proto::page::records(buf).map_err(|e| format!("binary page: {e}"))?;
    let mut stats = PageStats::default();
    for record in records {
        let record = record.map_err(|e| format!("binary page: {e}"))?;
        stats.records += 1;
        stats.body_bytes += record.body.len() as u64;
        if want_seqs {
            stats.seqs.push(record.seq);
        }
    }
    Ok(stats)
}

/// Splits complete SSE events off the front of `buf` (events end with a blank line) and
/// returns the `data` of each `data` event, leaving an incomplete tail in `buf`.
pub(crate) fn drain_sse_data(buf: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        // Accept both LF and CRLF line ends.
        let end = find_event_end(buf);
        let Some((event_len, sep_len)) = end else {
            break;
        };
        let event = String::from_utf8_lossy(&buf[..event_len]).into_owned();
        buf.drain(..event_len + sep_len);
        let mut name = "message";
        let mut data = String::new();
        let mut has_data = false;
        for line in event.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = if v.trim().is_empty() {
                    "message"
                } else {
                    match v.trim() {
                        "data" => "data",
                        "control" => "control",
                        _ => "other",
                    }
                };
            } else if let Some(v) = line.strip_prefix("data:") {
                if has_data {
                    data.push('\n');
                }
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
                has_data = true;
            }
        }
        if has_data && name == "data" {
            out.push(data);
        }
    }
    out
}

fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The `seq` of every record of a JSON-format `data` event.
pub(crate) fn json_seqs(data: &str) -> Result<Vec<u64>, String> {
    let value: serde_json::Value =
        serde_json::from_str(data).map_err(|e| format!("bad SSE data event: {e}"))?;
    let records = value
        .as_array()
        .ok_or("bad SSE data event: not a JSON array")?;
    records
        .iter()
        .map(|r| {
            r.get("seq")
                .and_then(|s| s.as_u64())
                .ok_or_else(|| "bad SSE data event: a record without seq".to_string())
        })
        .collect()
}

/// One independent HTTP client pool.
/// `total`: whole-request limit (`None` for live readers, which only get a read timeout).
pub(crate) fn build_client(
    conn: &Connection,
    total: Option<Duration>,
) -> Result<reqwest::Client, String> {
    static INSTALL_CRYPTO: std::sync::Once = std::sync::Once::new();
    // reqwest is built without a default crypto provider; rustls needs one for https.
    INSTALL_CRYPTO.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(70))
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true);
    if let Some(total) = total {
        builder = builder.timeout(total);
    }
    if conn.http2 {
        builder = builder.http2_prior_knowledge();
    }
    if let Some(token) = &conn.token {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "invalid token: it must be printable ASCII without line breaks")?;
        value.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, value);
        builder = builder.default_headers(headers);
    }
    if let Some(pem) = &conn.ca_cert_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| format!("invalid CA certificate: {e}"))?;
        builder = builder.tls_certs_merge(certs);
    }
    builder
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {}", describe(&e)))
}

/// `url` with these query parameters (reqwest's `query` needs a feature we do not build).
pub(crate) fn with_query(url: &str, pairs: &[(&str, &str)]) -> reqwest::Url {
    let mut url = reqwest::Url::parse(url).expect("checked endpoint + stream name");
    {
        let mut query = url.query_pairs_mut();
        for (k, v) in pairs {
            query.append_pair(k, v);
        }
    }
    url
}

/// A reqwest error with its causes (reqwest's own text is only the outermost layer).
pub(crate) fn describe(e: &reqwest::Error) -> String {
    pico_client::transport_message(e)
}

/// `<what>: <status> <error>: <message>` from an error response.
pub(crate) async fn status_error(what: &str, resp: reqwest::Response) -> String {
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    error_message(what, status.as_u16(), &body)
}

/// [`status_error`] for a status and body already read.
pub(crate) fn error_message(what: &str, status: u16, body: &str) -> String {
    let detail = pico_proto::error_body::decode(body.as_bytes())
        .map(
            |e| match (e.code.unwrap_or_default(), e.message.unwrap_or_default()) {
                (error, message) if !error.is_empty() && !message.is_empty() => {
                    format!("{error}: {message}")
                }
                (error, message) if error.is_empty() && message.is_empty() => {
                    body.trim().to_owned()
                }
                (error, message) => error + &message,
            },
        )
        .unwrap_or_else(|| body.trim().chars().take(200).collect());
    if detail.is_empty() {
        format!("{what}: HTTP {status}")
    } else {
        format!("{what}: HTTP {status}: {detail}")
    }
}

/// The error code of an error body (either protocol), if any.
pub(crate) fn error_code(body: &str) -> Option<String> {
    pico_proto::error_body::decode(body.as_bytes())?.code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_encoding() {
        let b = encode_batch(2, 3);
        assert_eq!(
            &b[..],
            &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0][..]
        );
        assert_eq!(encode_batch(1, 1024).len(), 5 + 8 + 1024);
    }

    #[test]
    fn ds_append_shapes() {
        let one = AppendShape::ds(1, 4);
        assert_eq!(&one.body[..], b"xxxx");
        assert_eq!(
            (one.stream_type, one.content_type),
            (OCTET_STREAM, OCTET_STREAM)
        );
        assert_eq!(one.ok, reqwest::StatusCode::NO_CONTENT);
        let three = AppendShape::ds(3, 4);
        assert_eq!(&three.body[..], br#"["xx","xx","xx"]"#);
        assert_eq!(
            (three.stream_type, three.content_type),
            (JSON_TYPE, JSON_TYPE)
        );
        // The server reads the elements back as `[e,e,e]`: the same bytes.
        assert_eq!(ds_json_chunk_records(three.body.len(), 4), 3);
        assert_eq!(ds_json_chunk_records(2, 4), 0);
        assert_eq!(ds_json_chunk_records(br#"["xx"]"#.len(), 4), 1);
        let pico = AppendShape::pico(2, 3);
        assert_eq!(pico.body, encode_batch(2, 3));
        assert_eq!(pico.content_type, BATCH_CONTENT_TYPE);
        assert_eq!(pico.ok, reqwest::StatusCode::OK);
    }

    #[test]
    fn page_parsing() {
        let mut page = vec![1u8];
        page.extend(2u32.to_be_bytes());
        for (seq, body, header) in [(7u64, &b"abc"[..], true), (8, &b""[..], false)] {
            page.extend(seq.to_be_bytes());
            page.extend(1_700_000_000_000i64.to_be_bytes());
            if header {
                page.extend(1u32.to_be_bytes());
                page.extend(1u32.to_be_bytes());
                page.extend(b"k");
                page.extend(2u32.to_be_bytes());
                page.extend(b"vv");
            } else {
                page.extend(0u32.to_be_bytes());
            }
            page.extend((body.len() as u32).to_be_bytes());
            page.extend(body);
        }
        let page = Bytes::from(page);
        let stats = parse_page(&page, true).unwrap();
        assert_eq!(
            stats,
            PageStats {
                records: 2,
                body_bytes: 3,
                seqs: vec![7, 8]
            }
        );
        assert!(parse_page(&page.slice(..page.len() - 2), false).is_err());
        assert!(parse_page(&Bytes::from_static(&[2, 0, 0, 0, 0]), false).is_err());
        let empty = Bytes::from_static(&[1, 0, 0, 0, 0]);
        assert_eq!(parse_page(&empty, false).unwrap().records, 0);
    }

    #[test]
    fn sse_events() {
        let mut buf = b"retry: 1000\n\nevent: data\nid: 2\ndata: [{\"seq\":0,\"body\":\"\"},{\"seq\":1,\"body\":\"\"}]\n\nevent: control\ndata: {\"next_seq\":2}\n\nevent: data\ndata: [{\"seq\"".to_vec();
        let events = drain_sse_data(&mut buf);
        assert_eq!(events.len(), 1);
        assert_eq!(json_seqs(&events[0]).unwrap(), vec![0, 1]);
        assert_eq!(buf, b"event: data\ndata: [{\"seq\"");
        buf.extend_from_slice(b":2}]\r\n\r\n: keep-alive\n\n");
        let events = drain_sse_data(&mut buf);
        assert_eq!(events.len(), 1);
        assert_eq!(json_seqs(&events[0]).unwrap(), vec![2]);
        assert!(buf.is_empty());
        assert!(json_seqs("{}").is_err());
    }

    #[test]
    fn error_codes() {
        assert_eq!(
            error_code(r#"{"error":"sequence_gap","message":"x"}"#).as_deref(),
            Some("sequence_gap")
        );
        assert_eq!(error_code("nope"), None);
    }
}
