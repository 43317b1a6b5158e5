//! The client against a scripted HTTP server: request shapes, response parsing, error mapping.
//! (End-to-end tests against the real server live elsewhere; these pin the client's side.)

use bytes::Bytes;
use pico_client::codec::{decode_binary_batch, encode_read_page};
use pico_client::{Client, ClientConfig, ErrorKind, Position, Protocol, Record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What the scripted server saw.
struct Captured {
    head: String,
    body: Vec<u8>,
}

impl Captured {
    fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

/// Serves one connection per scripted response, in order, each closed after its answer.
async fn script(responses: Vec<Vec<u8>>) -> (String, JoinHandle<Vec<Captured>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        for response in responses {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let head_end = loop {
                let mut chunk = [0u8; 4096];
                let n = socket.read(&mut chunk).await.unwrap();
                assert!(n > 0, "client closed before sending a request");
                buf.extend_from_slice(&chunk[..n]);
                if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break pos + 4;
                }
            };
            let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
            let mut captured = Captured {
                head,
                body: Vec::new(),
            };
            let length: usize = captured
                .header("content-length")
                .map_or(0, |v| v.parse().unwrap());
            let mut body = buf[head_end..].to_vec();
            while body.len() < length {
                let mut chunk = [0u8; 4096];
                let n = socket.read(&mut chunk).await.unwrap();
                body.extend_from_slice(&chunk[..n]);
            }
            captured.body = body;
            socket.write_all(&response).await.unwrap();
            socket.shutdown().await.unwrap();
            seen.push(captured);
        }
        seen
    });
    (endpoint, task)
}

fn response(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn client(endpoint: &str) -> Client {
    Client::new(ClientConfig::new(endpoint)).unwrap()
}

#[tokio::test]
async fn create_sends_type_and_ttl() {
    let (endpoint, server) = script(vec![
        response("201 Created", &[("pico-next-seq", "0")], b""),
        response("200 OK", &[("pico-next-seq", "0")], b""),
    ])
    .await;
    let client = client(&endpoint);
    assert!(client
        .create("/s/a", Some("text/plain"), Some(60))
        .await
        .unwrap());
    assert!(!client.create("s/a", None, None).await.unwrap());
    let seen = server.await.unwrap();
    assert_eq!(seen[0].request_line(), "PUT /s/a HTTP/1.1");
    assert_eq!(
        seen[0].header("content-type").as_deref(),
        Some("text/plain")
    );
    assert_eq!(seen[0].header("pico-ttl").as_deref(), Some("60"));
    assert_eq!(seen[1].request_line(), "PUT /s/a HTTP/1.1");
    assert_eq!(
        seen[1].header("content-type").as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(seen[1].header("pico-ttl"), None);
}

#[tokio::test]
async fn append_sends_a_binary_batch_and_parses_the_ack() {
    let headers = [
        ("pico-start-seq", "10"),
        ("pico-next-seq", "12"),
        ("pico-timestamp", "1700000000000"),
    ];
    let (endpoint, server) = script(vec![response("200 OK", &headers, b"")]).await;
    let records = [Bytes::from_static(b"a"), Bytes::from_static(b"bc")];
    let ack = client(&endpoint)
        .append_binary_batch("/s", &records)
        .await
        .unwrap();
    assert_eq!(
        (ack.start.seq(), ack.next.seq(), ack.timestamp),
        (Some(10), Some(12), Some(1_700_000_000_000))
    );
    let seen = server.await.unwrap();
    assert_eq!(seen[0].request_line(), "POST /s HTTP/1.1");
    assert_eq!(
        seen[0].header("content-type").as_deref(),
        Some("application/vnd.picomq.batch")
    );
    let decoded = decode_binary_batch(&Bytes::from(seen[0].body.clone())).unwrap();
    assert_eq!(
        decoded.iter().map(|r| r.body.clone()).collect::<Vec<_>>(),
        records
    );
}

#[tokio::test]
async fn read_decodes_the_binary_page() {
    let records = vec![Record {
        seq: 5,
        timestamp: 42,
        headers: vec![("k".into(), "v".into())],
        body: Bytes::from_static(b"hello"),
    }];
    let body = encode_read_page(&records).unwrap();
    let headers = [
        ("pico-next-seq", "6"),
        ("pico-up-to-date", "true"),
        ("content-type", "application/vnd.picomq.batch"),
    ];
    let (endpoint, server) = script(vec![response("200 OK", &headers, &body)]).await;
    let page = client(&endpoint).read("/s", 5).await.unwrap();
    assert_eq!(page.records, records);
    assert_eq!(page.next, 6);
    assert!(page.up_to_date);
    assert!(!page.closed);
    let seen = server.await.unwrap();
    assert_eq!(
        seen[0].request_line(),
        "GET /s?seq=5&format=binary HTTP/1.1"
    );
}

#[tokio::test]
async fn long_poll_timeout_is_an_empty_up_to_date_page() {
    let headers = [
        ("pico-next-seq", "9"),
        ("pico-up-to-date", "true"),
        ("pico-cursor", "77"),
    ];
    let (endpoint, server) = script(vec![response("204 No Content", &headers, b"")]).await;
    let page = client(&endpoint)
        .read_long_poll("/s", 9, Some("76"))
        .await
        .unwrap();
    assert!(page.records.is_empty());
    assert!(page.up_to_date);
    assert_eq!(page.next, 9);
    assert_eq!(page.cursor.as_deref(), Some("77"));
    let seen = server.await.unwrap();
    assert_eq!(
        seen[0].request_line(),
        "GET /s?seq=9&format=binary&live=long-poll&cursor=76 HTTP/1.1"
    );
}

#[tokio::test]
async fn head_maps_headers_and_404() {
    let headers = [
        ("pico-start-seq", "2"),
        ("pico-next-seq", "7"),
        ("pico-closed", "true"),
        ("content-type", "text/plain"),
        ("pico-ttl", "30"),
    ];
    let (endpoint, server) = script(vec![
        response("200 OK", &headers, b""),
        response("404 Not Found", &[], b""),
    ])
    .await;
    let client = client(&endpoint);
    let info = client.head("/s").await.unwrap().unwrap();
    assert_eq!(
        (info.start.seq(), info.next.seq(), info.closed),
        (Some(2), Some(7), true)
    );
    assert_eq!(info.content_type.as_deref(), Some("text/plain"));
    assert_eq!(info.ttl_secs, Some(30));
    assert_eq!(client.head("/s").await.unwrap(), None);
    let seen = server.await.unwrap();
    assert_eq!(seen[0].request_line(), "HEAD /s HTTP/1.1");
}

#[tokio::test]
async fn close_and_delete() {
    let (endpoint, server) = script(vec![
        response(
            "200 OK",
            &[("pico-next-seq", "3"), ("pico-closed", "true")],
            b"",
        ),
        response("204 No Content", &[], b""),
        response("404 Not Found", &[], b""),
    ])
    .await;
    let client = client(&endpoint);
    assert_eq!(client.close("/s").await.unwrap(), 3);
    assert!(client.delete("/s").await.unwrap());
    assert!(!client.delete("/s").await.unwrap());
    let seen = server.await.unwrap();
    assert_eq!(seen[0].request_line(), "POST /s HTTP/1.1");
    assert_eq!(seen[0].header("pico-closed").as_deref(), Some("true"));
    assert_eq!(seen[1].request_line(), "DELETE /s HTTP/1.1");
}

#[tokio::test]
async fn error_statuses_become_typed_errors() {
    let body = br#"{"error":"closed","message":"stream is closed","next_seq":3}"#;
    let headers = [
        ("content-type", "application/json"),
        ("pico-closed", "true"),
        ("pico-next-seq", "3"),
    ];
    let (endpoint, _server) = script(vec![response("409 Conflict", &headers, body)]).await;
    let err = client(&endpoint)
        .append_binary_batch("/s", &[Bytes::from_static(b"x")])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(err.status(), Some(409));
    assert_eq!(err.to_string(), "closed (409): stream is closed [next=3]");
}

#[tokio::test]
async fn redirects_are_followed_with_the_body() {
    let (target, target_server) = script(vec![response(
        "200 OK",
        &[
            ("pico-start-seq", "0"),
            ("pico-next-seq", "1"),
            ("pico-timestamp", "5"),
        ],
        b"",
    )])
    .await;
    let location = format!("{target}/s");
    let (endpoint, _server) = script(vec![response(
        "307 Temporary Redirect",
        &[("location", &location)],
        b"",
    )])
    .await;
    let ack = client(&endpoint)
        .append_single("/s", Bytes::from_static(b"payload"), Some("text/plain"))
        .await
        .unwrap();
    assert_eq!(ack.next, 1);
    let seen = target_server.await.unwrap();
    assert_eq!(seen[0].request_line(), "POST /s HTTP/1.1");
    assert_eq!(seen[0].body, b"payload");
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = client(&endpoint).head("/s").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport);
    assert!(err.to_string().starts_with("transport error: "), "{err}");
    assert!(err.is_retryable());
}

fn ds_client(endpoint: &str) -> Client {
    let mut config = ClientConfig::new(endpoint);
    config.protocol = Protocol::DurableStreams;
    Client::new(config).unwrap()
}

const OFFSET_2: &str = "0000000000000002_0000000000000000";
const OFFSET_3: &str = "0000000000000003_0000000000000000";

#[tokio::test]
async fn ds_mode_refuses_pico_only_operations_before_sending() {
    // Nothing listens on port 1: an attempt to send would be a transport error instead.
    let client = ds_client("http://127.0.0.1:1");
    let err = client.trim("/s", 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert_eq!(
        err.to_string(),
        "trim is a Pico protocol operation; use --protocol pico"
    );
    let err = client.list(None, None, None).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "the Durable Streams protocol has no stream listing; use --protocol pico"
    );
    let err = client
        .append_binary_batch("/s", &[Bytes::from_static(b"x")])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    // Positions of the other protocol are refused too.
    let err = client.read("/s", 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let pico = Client::new(ClientConfig::new("http://127.0.0.1:1")).unwrap();
    let err = pico.read("/s", Position::ds_now()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn ds_create_head_append_close_speak_durable_streams_headers() {
    let (endpoint, server) = script(vec![
        response("201 Created", &[("stream-next-offset", OFFSET_2)], b""),
        response(
            "200 OK",
            &[
                ("stream-next-offset", OFFSET_2),
                ("content-type", "text/plain"),
                ("stream-ttl", "60"),
            ],
            b"",
        ),
        response("204 No Content", &[("stream-next-offset", OFFSET_3)], b""),
        response(
            "204 No Content",
            &[("stream-next-offset", OFFSET_3), ("stream-closed", "true")],
            b"",
        ),
    ])
    .await;
    let client = ds_client(&endpoint);
    assert_eq!(client.beginning(), Position::ds_beginning());
    assert!(client
        .create("/s", Some("text/plain"), Some(60))
        .await
        .unwrap());
    let info = client.head("/s").await.unwrap().unwrap();
    assert_eq!(info.start, "-1");
    assert_eq!(info.next, OFFSET_2);
    assert!(!info.closed);
    assert_eq!(info.content_type.as_deref(), Some("text/plain"));
    assert_eq!(info.ttl_secs, Some(60));
    let ack = client
        .append_single("/s", Bytes::from_static(b"line"), Some("text/plain"))
        .await
        .unwrap();
    // The protocol reports only the new tail.
    assert_eq!(
        (ack.start.clone(), ack.next, ack.timestamp),
        (Position::from(OFFSET_3), Position::from(OFFSET_3), None)
    );
    assert_eq!(client.close("/s").await.unwrap(), OFFSET_3);
    let seen = server.await.unwrap();
    assert_eq!(seen[0].request_line(), "PUT /s HTTP/1.1");
    assert_eq!(seen[0].header("stream-ttl").as_deref(), Some("60"));
    assert_eq!(seen[0].header("pico-ttl"), None);
    assert_eq!(seen[1].request_line(), "HEAD /s HTTP/1.1");
    assert_eq!(seen[2].request_line(), "POST /s HTTP/1.1");
    assert_eq!(
        seen[2].header("content-type").as_deref(),
        Some("text/plain")
    );
    assert_eq!(seen[2].body, b"line");
    assert_eq!(seen[3].header("stream-closed").as_deref(), Some("true"));
    assert!(seen[3].body.is_empty());
}

#[tokio::test]
async fn ds_reads_are_one_chunk_at_the_next_offset() {
    let (endpoint, server) = script(vec![
        response(
            "200 OK",
            &[
                ("stream-next-offset", OFFSET_2),
                ("content-type", "text/plain"),
            ],
            b"ab",
        ),
        response(
            "200 OK",
            &[
                ("stream-next-offset", OFFSET_2),
                ("stream-up-to-date", "true"),
                ("content-type", "application/json; charset=utf-8"),
            ],
            b"[]",
        ),
        response(
            "204 No Content",
            &[
                ("stream-next-offset", OFFSET_2),
                ("stream-up-to-date", "true"),
                ("stream-cursor", "1001"),
            ],
            b"",
        ),
    ])
    .await;
    let client = ds_client(&endpoint);
    let page = client.read("/s", client.beginning()).await.unwrap();
    assert!(page.records.is_empty());
    assert_eq!(page.chunk.as_deref(), Some(&b"ab"[..]));
    assert_eq!(page.next, OFFSET_2);
    assert!(!page.up_to_date && !page.closed);
    assert_eq!(
        page.entries(),
        vec![(Position::from(OFFSET_2), &Bytes::from_static(b"ab"))]
    );
    // An empty JSON array holds no message: an empty page.
    let page = client.read("/s", &page.next).await.unwrap();
    assert!(page.is_empty() && page.up_to_date);
    let page = client
        .read_long_poll("/s", OFFSET_2, Some("1000"))
        .await
        .unwrap();
    assert!(page.is_empty() && page.up_to_date);
    assert_eq!(page.cursor.as_deref(), Some("1001"));
    let seen = server.await.unwrap();
    assert_eq!(seen[0].request_line(), "GET /s?offset=-1 HTTP/1.1");
    assert_eq!(
        seen[1].request_line(),
        format!("GET /s?offset={OFFSET_2} HTTP/1.1")
    );
    assert_eq!(
        seen[2].request_line(),
        format!("GET /s?offset={OFFSET_2}&live=long-poll&cursor=1000 HTTP/1.1")
    );
}

#[tokio::test]
async fn ds_errors_map_to_kinds() {
    let closed = br#"{"error":{"code":"STREAM_CLOSED","message":"stream is closed"}}"#;
    let (endpoint, _server) = script(vec![
        response(
            "409 Conflict",
            &[
                ("content-type", "application/json"),
                ("stream-closed", "true"),
                ("stream-next-offset", OFFSET_3),
            ],
            closed,
        ),
        response(
            "409 Conflict",
            &[("content-type", "application/json")],
            br#"{"error":{"code":"CONFLICT","message":"content type mismatch"}}"#,
        ),
    ])
    .await;
    let client = ds_client(&endpoint);
    let err = client
        .append_single("/s", Bytes::from_static(b"x"), None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(
        err.to_string(),
        format!("STREAM_CLOSED (409): stream is closed [next={OFFSET_3}]")
    );
    let err = client
        .append_single("/s", Bytes::from_static(b"x"), None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
}

#[test]
fn bad_endpoints_are_rejected_up_front() {
    for endpoint in ["127.0.0.1:4437", "ftp://x", "http://"] {
        let err = Client::new(ClientConfig::new(endpoint)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{endpoint}");
    }
}

#[tokio::test]
async fn the_token_goes_on_every_request_and_is_not_shown() {
    let (endpoint, server) = script(vec![
        response("201 Created", &[("pico-next-seq", "0")], b""),
        response("404 Not Found", &[], b""),
    ])
    .await;
    let mut config = ClientConfig::new(endpoint);
    config.token = Some("s3cret-token".into());
    let client = Client::new(config).unwrap();
    assert!(!format!("{client:?}").contains("s3cret"), "{client:?}");
    client.create("/s", None, None).await.unwrap();
    assert_eq!(client.head("/s").await.unwrap(), None);
    for seen in server.await.unwrap() {
        assert_eq!(
            seen.header("authorization").as_deref(),
            Some("Bearer s3cret-token")
        );
    }
    let mut config = ClientConfig::new("http://127.0.0.1:1");
    config.token = Some("bad\ntoken".into());
    let err = Client::new(config).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(!err.to_string().contains("bad"), "{err}");
}

#[test]
fn a_bad_ca_certificate_is_rejected_up_front() {
    let mut config = ClientConfig::new("https://127.0.0.1:1");
    config.ca_cert_pem = Some(b"not a certificate".to_vec());
    let err = Client::new(config).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("CA certificate"), "{err}");
}

#[tokio::test]
async fn list_sends_the_query_and_parses_the_page() {
    let body = br#"{"streams":[{"name":"/a","content_type":"text/plain","start_seq":2,"next_seq":5,"closed":true,"ttl":60,"expires_at":"2100-01-01T00:00:00Z"},{"name":"/b","content_type":"application/octet-stream","start_seq":0,"next_seq":0,"closed":false}],"has_more":true}"#;
    let (endpoint, server) = script(vec![
        response("200 OK", &[("content-type", "application/json")], body),
        response(
            "200 OK",
            &[("content-type", "application/json")],
            br#"{"streams":[],"has_more":false}"#,
        ),
    ])
    .await;
    let client = client(&endpoint);
    let list = client
        .list(Some("/a b"), Some("/0"), Some(2))
        .await
        .unwrap();
    assert!(list.has_more);
    assert_eq!(list.streams.len(), 2);
    let a = &list.streams[0];
    assert_eq!(
        (a.name.as_str(), a.start, a.next, a.closed, a.ttl_secs),
        ("/a", 2, 5, true, Some(60))
    );
    assert_eq!(a.expires_at.as_deref(), Some("2100-01-01T00:00:00Z"));
    assert_eq!(list.streams[1].ttl_secs, None);
    let empty = client.list(None, None, Some(0)).await.unwrap();
    assert_eq!(empty, pico_client::StreamList::default());
    let seen = server.await.unwrap();
    assert_eq!(
        seen[0].request_line(),
        "GET /?prefix=%2Fa+b&start_after=%2F0&limit=2 HTTP/1.1"
    );
    assert_eq!(seen[1].request_line(), "GET / HTTP/1.1");
}

#[tokio::test]
async fn trim_sends_the_header_without_a_body() {
    let (endpoint, server) =
        script(vec![response("200 OK", &[("pico-start-seq", "4")], b"")]).await;
    assert_eq!(client(&endpoint).trim("/s", 9).await.unwrap(), 4);
    let seen = server.await.unwrap();
    assert_eq!(seen[0].request_line(), "POST /s HTTP/1.1");
    assert_eq!(seen[0].header("pico-trim-seq").as_deref(), Some("9"));
    assert!(seen[0].body.is_empty());
    let mut config = ClientConfig::new("http://127.0.0.1:1");
    config.protocol = Protocol::DurableStreams;
    let err = Client::new(config)
        .unwrap()
        .trim("/s", 1)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "trim is a Pico protocol operation; use --protocol pico"
    );
}

#[tokio::test]
async fn producer_appends_carry_the_identity_and_detect_duplicates() {
    let (endpoint, server) = script(vec![
        response(
            "200 OK",
            &[
                ("pico-start-seq", "3"),
                ("pico-next-seq", "5"),
                ("pico-timestamp", "77"),
                ("pico-producer-seq", "0"),
            ],
            b"",
        ),
        response(
            "200 OK",
            &[("pico-next-seq", "5"), ("pico-producer-seq", "0")],
            b"",
        ),
    ])
    .await;
    let client = client(&endpoint);
    let batch =
        pico_client::codec::encode_binary_batch(&[Bytes::from("a"), Bytes::from("b")]).unwrap();
    let ack = client
        .append_as_producer("/s", batch.clone(), "p1", 2, 0)
        .await
        .unwrap();
    assert_eq!((ack.start, ack.next, ack.timestamp), (Some(3), 5, Some(77)));
    assert!(!ack.is_duplicate());
    let dup = client
        .append_as_producer("/s", batch, "p1", 2, 0)
        .await
        .unwrap();
    assert!(dup.is_duplicate());
    assert_eq!((dup.next, dup.producer_seq), (5, Some(0)));
    let seen = server.await.unwrap();
    assert_eq!(seen[0].header("pico-producer-id").as_deref(), Some("p1"));
    assert_eq!(seen[0].header("pico-producer-epoch").as_deref(), Some("2"));
    assert_eq!(seen[0].header("pico-producer-seq").as_deref(), Some("0"));
    assert_eq!(
        seen[0].header("content-type").as_deref(),
        Some("application/vnd.picomq.batch")
    );
    assert_eq!(
        decode_binary_batch(&Bytes::from(seen[0].body.clone()))
            .unwrap()
            .len(),
        2
    );
}
