//! HTTP/2 with prior knowledge (h2c) on the same port as HTTP/1.1, against a real `pico serve`:
//! the preface is detected, bodies larger than the initial flow-control window stream through,
//! many requests run concurrently on one connection, and SSE works over h2.

mod common;

use std::time::{Duration, Instant};

use common::Server;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn h2_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[test]
fn h2_prior_knowledge_serves_the_pico_protocol() {
    let server = Server::start(&["--max-body-size", "4194304"]);
    let base = format!("http://{}", server.addr);
    runtime().block_on(async {
        let client = h2_client();
        let created = client
            .put(format!("{base}/h2/a"))
            .header("content-type", "application/octet-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(created.version(), reqwest::Version::HTTP_2);
        assert_eq!(created.status(), 201);
        assert_eq!(created.headers()["x-content-type-options"], "nosniff");

        // 3 MiB: far past the 64 KiB default window, so flow control must be released.
        let big: Vec<u8> = (0..3 * 1024 * 1024u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let appended = client
            .post(format!("{base}/h2/a"))
            .body(big.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(appended.status(), 200);
        assert_eq!(appended.headers()["pico-start-seq"], "0");
        let read = client
            .get(format!("{base}/h2/a?format=raw&bytes=4194304"))
            .send()
            .await
            .unwrap();
        assert_eq!(read.status(), 200);
        assert_eq!(read.bytes().await.unwrap().as_ref(), &big[..]);

        let too_big = vec![0u8; 4 * 1024 * 1024 + 1];
        let refused = client
            .post(format!("{base}/h2/a"))
            .body(too_big)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 413);
        let error: serde_json::Value =
            serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
        assert_eq!(error["error"], "too_large");

        let missing = client
            .get(format!("{base}/h2/missing"))
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), 404);
        let head = client.head(format!("{base}/h2/a")).send().await.unwrap();
        assert_eq!(head.status(), 200);
        assert_eq!(head.headers()["pico-next-seq"], "1");
    });
}

#[test]
fn concurrent_large_reads_on_one_connection_arrive_intact() {
    // Large responses interleaved on one connection fill the socket: the server's vectored
    // writes (frame header and payload in one send) are cut short and resumed mid-buffer.
    let server = Server::start(&["--max-body-size", "4194304"]);
    let base = format!("http://{}", server.addr);
    runtime().block_on(async {
        let client = h2_client();
        client.put(format!("{base}/h2/large")).send().await.unwrap();
        let records: Vec<Vec<u8>> = (0..4u32)
            .map(|r| {
                (0..(1 << 20) + 777 * r)
                    .map(|i| (i.wrapping_mul(7 + 2 * r) % 253) as u8)
                    .collect()
            })
            .collect();
        for record in &records {
            let appended = client
                .post(format!("{base}/h2/large"))
                .body(record.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(appended.status(), 200);
        }
        let reads = (0..16usize).map(|i| {
            let client = client.clone();
            let start = i % 4;
            let url = format!("{base}/h2/large?format=raw&seq={start}&bytes=8388608");
            let records = records.clone();
            async move {
                let response = client.get(url).send().await.unwrap();
                assert_eq!(response.status(), 200);
                assert_eq!(response.version(), reqwest::Version::HTTP_2);
                let next: usize = response.headers()["pico-next-seq"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                // The server's read budget may end the page early: whole records, in order.
                assert!(next > start, "read {i}: no record");
                let expected = records[start..next].concat();
                let body = response.bytes().await.unwrap();
                assert_eq!(body.len(), expected.len(), "read {i}");
                assert!(body.as_ref() == &expected[..], "read {i}: bytes differ");
            }
        });
        let handles: Vec<_> = reads.map(tokio::spawn).collect();
        for handle in handles {
            handle.await.unwrap();
        }
    });
}

#[test]
fn many_concurrent_requests_on_one_connection() {
    let server = Server::start(&["--cores", "2"]);
    let base = format!("http://{}", server.addr);
    runtime().block_on(async {
        let client = h2_client();
        client.put(format!("{base}/h2/many")).send().await.unwrap();
        let requests = (0..300).map(|i| {
            let client = client.clone();
            let url = format!("{base}/h2/many");
            async move {
                let response = client.post(url).body(format!("r{i}")).send().await.unwrap();
                assert_eq!(response.status(), 200);
                response.headers()["pico-start-seq"]
                    .to_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            }
        });
        let handles: Vec<_> = requests.map(tokio::spawn).collect();
        let mut offsets = Vec::new();
        for handle in handles {
            offsets.push(handle.await.unwrap());
        }
        offsets.sort_unstable();
        assert_eq!(
            offsets,
            (0..300).collect::<Vec<u64>>(),
            "every append got its own offset"
        );
        // Cross-core: these streams land on both cores; each answers over the same connection.
        for i in 0..20 {
            let response = client
                .put(format!("{base}/h2/core-{i}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 201);
        }
    });
}

#[test]
fn sse_over_h2_delivers_new_records() {
    let server = Server::start(&[]);
    let base = format!("http://{}", server.addr);
    runtime().block_on(async {
        let client = h2_client();
        client.put(format!("{base}/h2/live")).send().await.unwrap();
        let mut events = client
            .get(format!("{base}/h2/live?live=sse"))
            .send()
            .await
            .unwrap();
        assert_eq!(events.version(), reqwest::Version::HTTP_2);
        assert_eq!(events.headers()["content-type"], "text/event-stream");
        client
            .post(format!("{base}/h2/live"))
            .body("over-h2")
            .send()
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = String::new();
        while !seen.contains("over-h2") {
            assert!(
                Instant::now() < deadline,
                "no data event over h2; got {seen:?}"
            );
            let chunk = tokio::time::timeout(Duration::from_secs(10), events.chunk())
                .await
                .unwrap()
                .unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk.expect("stream still open")));
        }
        assert!(seen.starts_with("retry: "), "{seen}");
        assert!(
            seen.contains("event: data\nid: 1\ndata:[{\"seq\":0,"),
            "{seen}"
        );
    });
}

#[test]
fn durable_streams_over_h2_answer_with_absolute_locations() {
    let server = Server::start(&["--protocol", "ds"]);
    let base = format!("http://{}", server.addr);
    runtime().block_on(async {
        let client = h2_client();
        let created = client
            .put(format!("{base}/v1/stream/h2"))
            .header("content-type", "text/plain")
            .body("one")
            .send()
            .await
            .unwrap();
        assert_eq!(created.version(), reqwest::Version::HTTP_2);
        assert_eq!(created.status(), 201);
        // h2 has no Host header: the location comes from :authority.
        assert_eq!(
            created.headers()["location"].to_str().unwrap(),
            format!("{base}/v1/stream/h2")
        );
        let read = client
            .get(format!("{base}/v1/stream/h2?offset=-1"))
            .send()
            .await
            .unwrap();
        assert_eq!(read.headers()["stream-up-to-date"], "true");
        assert_eq!(read.text().await.unwrap(), "one");
    });
}
