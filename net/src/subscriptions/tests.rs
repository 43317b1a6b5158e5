//! The conformance suite's six subscription scenarios, in process: a one-core engine in
//! memory, requests straight into `Subscriptions::handle`, writes reported the way the DS
//! handler reports them, and a real HTTP receiver on loopback for the webhooks.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use pico_engine::{
    boot, AppendRequest, CoreHandle, CreateRequest, EngineConfig, ReadFrom, ReadRequest,
    RecordInput, StreamConfig,
};
use serde_json::{json, Value};

use super::{keys, offset_string, Subscriptions};
use crate::transport::message::Request;

const BASE: &str = "http://127.0.0.1:4437";
const ROOT: &str = "/v1/stream/";

fn run_node<F, Fut>(f: F)
where
    F: FnOnce(Rc<CoreHandle>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        cores: 1,
        wal_dir: dir.path().join("wal"),
        durability: pico_engine::Durability::Memory,
        segment_size: 1 << 20,
        segment_max_age_ms: 1000,
        segment_cache_bytes: 1 << 20,
        node_epoch_ms: pico_engine::now_ms() as u64,
        node_id: None,
        catalog_id: None,
        in_flight_bytes_max: pico_engine::limits::IN_FLIGHT_BYTES_PER_CORE_DEFAULT,
        unuploaded_bytes_max: pico_engine::limits::UNUPLOADED_BYTES_PER_CORE_DEFAULT,
        gc_interval_ms: 60_000,
        object_puts_per_second: pico_engine::limits::OBJECT_PUTS_PER_SECOND_DEFAULT,
        wal_salvage: false,
        producers: Default::default(),
    };
    let meta = format!("sqlite:{}", dir.path().join("meta.db").display());
    let storage = format!("-2@file://{}", dir.path().join("objects").display());
    let booted = boot(config, &meta, &storage, None).expect("boot");
    let seed = booted.seeds.into_iter().next().expect("one core");
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(move || async move {
            let core = CoreHandle::start(seed).await.expect("core starts");
            f(core).await;
        })
        .expect("executor")
        .join()
        .expect("join");
    booted.meta.shutdown();
}

struct Node {
    core: Rc<CoreHandle>,
    subs: Arc<Subscriptions>,
}

struct Answer {
    status: u16,
    headers: Vec<(&'static str, crate::transport::message::HeaderValue)>,
    body: Value,
}

impl Node {
    /// A node's subscriptions, told of the core's writes as `pico serve` tells them.
    fn new(core: Rc<CoreHandle>) -> Node {
        let subs = Arc::new(Subscriptions::new());
        subs.start_on_core(&core);
        Node { core, subs }
    }

    async fn request(&self, method: &str, rest: &str, token: Option<&str>, body: Value) -> Answer {
        let mut headers = vec![(
            "content-type".to_string(),
            Bytes::from_static(b"application/json"),
        )];
        if let Some(token) = token {
            headers.push((
                "authorization".into(),
                Bytes::from(format!("Bearer {token}")),
            ));
        }
        let request = Request {
            method: method.into(),
            path: format!("{ROOT}__ds/{rest}"),
            query: String::new(),
            headers,
            body: if body.is_null() {
                Bytes::new()
            } else {
                Bytes::from(body.to_string())
            },
        };
        let response = self
            .subs
            .handle(&self.core, BASE, ROOT, ROOT, rest, &request)
            .await;
        let body = response.full_body().cloned().unwrap_or_default();
        Answer {
            status: response.status,
            headers: response.headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        }
    }

    /// Appends one JSON message (creating the stream first) and reports the write.
    async fn write(&self, path: &str, message: Value) -> String {
        let name = format!("{ROOT}{path}");
        let config = StreamConfig {
            content_type: "application/json".into(),
            ttl_sec: None,
            expires_at_ms: None,
            retention: Default::default(),
        };
        let create = CreateRequest {
            config,
            closed: false,
            records: Vec::new(),
            fork: None,
        };
        self.core.create(&name, create).await.expect("create");
        let append = AppendRequest {
            records: vec![RecordInput {
                headers: Vec::new(),
                body: Bytes::from(message.to_string()),
            }],
            close: false,
            match_offset: None,
            producer: None,
            content_type: None,
            writer_seq: None,
            json_checked: false,
        };
        // The engine's acknowledgement wakes the subscriptions (`CoreWrites`).
        let ack = self.core.append(&name, append).await.expect("append");
        offset_string(ack.next_offset)
    }

    async fn messages(&self, path: &str) -> Vec<Value> {
        let read = ReadRequest {
            from: ReadFrom::Offset(0),
            max_records: 1000,
            max_bytes: 1 << 20,
            wait_ms: None,
            with_content_type: false,
            bound: None,
        };
        match self.core.read(&format!("{ROOT}{path}"), &read).await {
            Ok(batch) => batch
                .records
                .iter()
                .map(|r| serde_json::from_slice(&r.body).unwrap())
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// How long a condition or a delivery may take: a bound for a broken registry, far beyond what
/// a busy machine delays them by.
const EVENTUALLY: Duration = Duration::from_secs(30);
/// The lease of the subscriptions whose wakes the tests answer (or claim twice): far longer
/// than a busy machine can take between two steps, so it never runs out under them. The test
/// of a lease running out has its own, short one.
const LONG_LEASE_MS: u64 = 120_000;

/// Polls `check` (yielding to the executor) until it holds, like the suite's waitForCondition.
async fn eventually<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + EVENTUALLY;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "condition not met within {EVENTUALLY:?}"
        );
        glommio::timer::sleep(Duration::from_millis(25)).await;
    }
}

struct Received {
    signature: String,
    raw: String,
    body: Value,
}

/// A webhook receiver on loopback answering every POST with `reply`.
fn receiver(reply: Value) -> (String, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/webhook",
        listener.local_addr().unwrap().port()
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let data = read_http_request(&mut conn);
            let text = String::from_utf8_lossy(&data).to_string();
            let (head, body) = text.split_once("\r\n\r\n").expect("a whole request");
            let (head, body) = (head.to_string(), body.to_string());
            let signature = head
                .lines()
                .find_map(|l| l.strip_prefix("Webhook-Signature: "))
                .unwrap_or_default()
                .to_string();
            let reply = reply.to_string();
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
                reply.len()
            );
            let parsed = serde_json::from_str(&body).unwrap();
            if tx
                .send(Received {
                    signature,
                    raw: body,
                    body: parsed,
                })
                .is_err()
            {
                return;
            }
        }
    });
    (url, rx)
}

async fn next_delivery(rx: &mpsc::Receiver<Received>) -> Received {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        match rx.try_recv() {
            Ok(received) => return received,
            Err(mpsc::TryRecvError::Empty) if Instant::now() < deadline => {
                glommio::timer::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("no webhook delivery: {e}"),
        }
    }
}

fn webhook_sub(url: &str) -> Value {
    webhook_sub_with_lease(url, LONG_LEASE_MS)
}

fn webhook_sub_with_lease(url: &str, lease_ms: u64) -> Value {
    json!({"type": "webhook", "pattern": "events/*", "webhook": {"url": url}, "lease_ttl_ms": lease_ms})
}

#[test]
fn conformance_scenarios() {
    run_node(|core| async move {
        let node = Node::new(core);
        creates_and_reconfirms(&node).await;
        rejects_unsafe_urls(&node).await;
        synchronous_done_acks(&node).await;
        callback_acks_and_fences(&node).await;
        explicit_streams(&node).await;
        pull_wake_leases(&node).await;
        unanswered_wakes_are_redelivered(&node).await;
    });
}

async fn creates_and_reconfirms(node: &Node) {
    let (url, _rx) = receiver(json!({}));
    let mut spec = webhook_sub(&url);
    spec["description"] = json!("test subscription");
    let created = node
        .request("PUT", "subscriptions/s1", None, spec.clone())
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert!(created.body.get("webhook_secret").is_none());
    let signing = &created.body["webhook"]["signing"];
    assert_eq!(created.body["webhook"]["url"], url.as_str());
    assert_eq!(signing["alg"], "ed25519");
    assert!(signing["kid"].as_str().unwrap().starts_with("ds_"));
    assert_eq!(signing["jwks_url"], format!("{BASE}{ROOT}__ds/jwks.json"));
    let jwks = node.request("GET", "jwks.json", None, Value::Null).await;
    assert_eq!(jwks.status, 200);
    assert!(jwks
        .headers
        .contains(&("content-type", "application/jwk-set+json".into())));
    assert_eq!(jwks.body["keys"][0]["kid"], signing["kid"]);
    assert_eq!(
        node.request("PUT", "subscriptions/s1", None, spec.clone())
            .await
            .status,
        200
    );
    spec["lease_ttl_ms"] = json!(2000);
    let conflict = node.request("PUT", "subscriptions/s1", None, spec).await;
    assert_eq!(conflict.status, 409);
    let got = node
        .request("GET", "subscriptions/s1", None, Value::Null)
        .await;
    assert_eq!(
        (got.status, &got.body["id"], &got.body["type"]),
        (200, &json!("s1"), &json!("webhook"))
    );
    assert_eq!(
        node.request("DELETE", "subscriptions/s1", None, Value::Null)
            .await
            .status,
        204
    );
    assert_eq!(
        node.request("GET", "subscriptions/s1", None, Value::Null)
            .await
            .status,
        404
    );
    assert_eq!(
        node.request("GET", "nothing/here", None, Value::Null)
            .await
            .status,
        404
    );
}

async fn rejects_unsafe_urls(node: &Node) {
    let bad = node
        .request(
            "PUT",
            "subscriptions/s2",
            None,
            webhook_sub("http://10.0.0.1/hook"),
        )
        .await;
    assert_eq!(
        (bad.status, &bad.body["error"]["code"]),
        (400, &json!("WEBHOOK_URL_REJECTED"))
    );
}

async fn synchronous_done_acks(node: &Node) {
    let (url, rx) = receiver(json!({"done": true}));
    let created = node
        .request("PUT", "subscriptions/s3", None, webhook_sub(&url))
        .await;
    assert_eq!(created.status, 201);
    let jwks = node
        .request("GET", "jwks.json", None, Value::Null)
        .await
        .body;
    let tail = node.write("events/sync", json!({"event": "created"})).await;
    let delivery = next_delivery(&rx).await;
    let key = &jwks["keys"][0];
    let public = URL_SAFE_NO_PAD.decode(key["x"].as_str().unwrap()).unwrap();
    let now = (pico_engine::now_ms() / 1000) as u64;
    assert!(keys::verify_signature_header(
        &delivery.signature,
        delivery.raw.as_bytes(),
        key["kid"].as_str().unwrap(),
        &public,
        now
    ));
    assert_eq!(delivery.body["subscription_id"], "s3");
    assert_eq!(
        delivery.body["callback_url"],
        format!("{BASE}{ROOT}__ds/subscriptions/s3/callback")
    );
    let stream = &delivery.body["streams"][0];
    assert_eq!(
        (&stream["path"], &stream["has_pending"]),
        (&json!("events/sync"), &json!(true))
    );
    assert_eq!(stream["tail_offset"], tail.as_str());
    eventually(|| async {
        let got = node
            .request("GET", "subscriptions/s3", None, Value::Null)
            .await;
        got.body["streams"][0]["acked_offset"] == tail.as_str()
    })
    .await;
    node.request("DELETE", "subscriptions/s3", None, Value::Null)
        .await;
}

async fn callback_acks_and_fences(node: &Node) {
    let (url, rx) = receiver(json!({}));
    node.request("PUT", "subscriptions/s4", None, webhook_sub(&url))
        .await;
    // The stream of the previous scenario already existed: linked, with nothing pending.
    let got = node
        .request("GET", "subscriptions/s4", None, Value::Null)
        .await;
    assert_eq!(
        got.body["streams"],
        json!([{"path": "events/sync", "link_type": "glob", "acked_offset": offset_string(1)}])
    );
    let tail = node
        .write("events/callback", json!({"event": "created"}))
        .await;
    let delivery = next_delivery(&rx).await.body;
    let callback_url = delivery["callback_url"].as_str().unwrap();
    let rest = callback_url
        .strip_prefix(&format!("{BASE}{ROOT}__ds/"))
        .unwrap();
    let token = delivery["callback_token"].as_str().unwrap();
    let ack = json!({
        "wake_id": delivery["wake_id"],
        "generation": delivery["generation"],
        "acks": [{"stream": "events/callback", "offset": tail}],
        "done": true,
    });
    let answer = node.request("POST", rest, Some(token), ack.clone()).await;
    assert_eq!(
        (answer.status, &answer.body),
        (200, &json!({"ok": true, "next_wake": false}))
    );
    let stale = node.request("POST", rest, Some(token), ack.clone()).await;
    assert_eq!(
        (stale.status, &stale.body["error"]["code"]),
        (409, &json!("FENCED"))
    );
    let anonymous = node.request("POST", rest, None, ack).await;
    assert_eq!(anonymous.status, 401);
    node.request("DELETE", "subscriptions/s4", None, Value::Null)
        .await;
}

async fn explicit_streams(node: &Node) {
    let (url, _rx) = receiver(json!({}));
    let spec = json!({"type": "webhook", "streams": ["manual/a"], "webhook": {"url": url}});
    assert_eq!(
        node.request("PUT", "subscriptions/s5", None, spec)
            .await
            .status,
        201
    );
    let add = node
        .request(
            "POST",
            "subscriptions/s5/streams",
            None,
            json!({"streams": ["manual/b"]}),
        )
        .await;
    assert_eq!(add.status, 204);
    let remove = node
        .request(
            "DELETE",
            "subscriptions/s5/streams/manual%2Fb",
            None,
            Value::Null,
        )
        .await;
    assert_eq!(remove.status, 204);
    let got = node
        .request("GET", "subscriptions/s5", None, Value::Null)
        .await;
    assert_eq!(
        got.body["streams"],
        json!([{"path": "manual/a", "link_type": "explicit", "acked_offset": offset_string(0)}])
    );
    node.request("DELETE", "subscriptions/s5", None, Value::Null)
        .await;
}

async fn pull_wake_leases(node: &Node) {
    node.write("wake/pool", json!({"seed": true})).await;
    let spec = json!({"type": "pull-wake", "pattern": "events/*", "wake_stream": "wake/pool", "lease_ttl_ms": LONG_LEASE_MS});
    assert_eq!(
        node.request("PUT", "subscriptions/p1", None, spec)
            .await
            .status,
        201
    );
    let tail = node.write("events/pull", json!({"event": "created"})).await;
    eventually(|| async {
        node.messages("wake/pool")
            .await
            .iter()
            .any(|m| m["subscription_id"] == "p1")
    })
    .await;
    let claim = node
        .request(
            "POST",
            "subscriptions/p1/claim",
            None,
            json!({"worker": "worker-1"}),
        )
        .await;
    assert_eq!(claim.status, 200, "{}", claim.body);
    let streams = claim.body["streams"].as_array().unwrap();
    let pull = streams.iter().find(|s| s["path"] == "events/pull").unwrap();
    assert_eq!(pull["tail_offset"], tail.as_str());
    let busy = node
        .request(
            "POST",
            "subscriptions/p1/claim",
            None,
            json!({"worker": "worker-2"}),
        )
        .await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.body["error"]["code"], "ALREADY_CLAIMED");
    assert_eq!(busy.body["error"]["current_holder"], "worker-1");
    let token = claim.body["token"].as_str().unwrap();
    let ack = json!({
        "wake_id": claim.body["wake_id"],
        "generation": claim.body["generation"],
        "acks": [{"stream": "events/pull", "offset": tail}],
        "done": true,
    });
    let acked = node
        .request("POST", "subscriptions/p1/ack", Some(token), ack)
        .await;
    assert_eq!(
        (acked.status, &acked.body),
        (200, &json!({"ok": true, "next_wake": false}))
    );
    node.write("events/pull", json!({"event": "second"})).await;
    let claim2 = node
        .request(
            "POST",
            "subscriptions/p1/claim",
            None,
            json!({"worker": "worker-1"}),
        )
        .await;
    assert_eq!(claim2.status, 200);
    let release =
        json!({"wake_id": claim2.body["wake_id"], "generation": claim2.body["generation"]});
    let released = node
        .request(
            "POST",
            "subscriptions/p1/release",
            claim2.body["token"].as_str(),
            release,
        )
        .await;
    assert_eq!(released.status, 204);
    node.request("DELETE", "subscriptions/p1", None, Value::Null)
        .await;
}

async fn unanswered_wakes_are_redelivered(node: &Node) {
    let (url, rx) = receiver(json!({}));
    node.request(
        "PUT",
        "subscriptions/s6",
        None,
        webhook_sub_with_lease(&url, 1000),
    )
    .await;
    node.write("events/silent", json!({"n": 1})).await;
    let first = next_delivery(&rx).await.body;
    // Nobody calls back: the sweeper ends the wake when its 1 s lease runs out and, the work
    // still pending, delivers the next generation.
    let second = next_delivery(&rx).await.body;
    assert_eq!(first["generation"], 1);
    assert_eq!(second["generation"], 2);
    assert_ne!(first["wake_id"], second["wake_id"]);
    node.request("DELETE", "subscriptions/s6", None, Value::Null)
        .await;
}

/// Reads one HTTP/1.1 request from `conn`, up to the end of its `Content-Length` body: the raw
/// bytes (what the fake webhook receivers of these tests inspect).
pub(super) fn read_http_request(conn: &mut impl Read) -> Vec<u8> {
    let mut request = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = conn.read(&mut chunk).unwrap();
        request.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&request).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .unwrap()
                .parse()
                .unwrap();
            if body.len() >= len {
                return request;
            }
        }
    }
}

/// A write through the Pico protocol wakes a Durable Streams subscription too: the Pico
/// append passes its acknowledgement's next offset to the same wake-up as the DS handler.
/// The Pico handlers' settings on `subs`.
fn pico_settings(subs: &Arc<Subscriptions>) -> crate::pico::PicoSettings {
    crate::pico::PicoSettings {
        long_poll_timeout_ms: 1000,
        max_chunk_size: 64 * 1024,
        sse_max_duration_ms: 1000,
        cors_origin: "*".into(),
        auth: None,
        subscriptions: subs.clone(),
        consumer_wakes: Default::default(),
        scheme: "http",
        default_retention: Default::default(),
        durable_streams: Default::default(),
    }
}

/// A Pico request with a JSON body on `{ROOT}{path}`.
fn pico_request(method: &str, path: &str, body: &'static str) -> Request {
    Request {
        method: method.into(),
        path: format!("{ROOT}{path}"),
        query: String::new(),
        headers: vec![(
            "content-type".to_string(),
            Bytes::from_static(b"application/json"),
        )],
        body: Bytes::from_static(body.as_bytes()),
    }
}

/// Subscribes `id` (pull-wake, wake stream `wake/{id}`) to `pattern`, runs `write`, and
/// checks that a wake of `id` reaches the wake stream within [`EVENTUALLY`].
async fn woken_by<F, Fut>(node: &Node, id: &str, pattern: &str, write: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let wake = format!("wake/{id}");
    node.write(&wake, json!({"seed": true})).await;
    let spec = json!({"type": "pull-wake", "pattern": pattern, "wake_stream": wake, "lease_ttl_ms": LONG_LEASE_MS});
    let created = node
        .request("PUT", &format!("subscriptions/{id}"), None, spec)
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    write().await;
    eventually(|| async {
        node.messages(&wake)
            .await
            .iter()
            .any(|m| m["subscription_id"] == id)
    })
    .await;
}

#[test]
fn a_pico_append_wakes_a_subscription() {
    run_node(|core| async move {
        let node = Node::new(core);
        let settings = pico_settings(&node.subs);
        let core = &node.core;
        woken_by(&node, "p2", "pico/*", || async {
            let create =
                crate::pico::handle(core, &settings, None, pico_request("PUT", "pico/a", "")).await;
            assert_eq!(create.status, 201);
            let append = crate::pico::handle(
                core,
                &settings,
                None,
                pico_request("POST", "pico/a", "{\"n\":1}"),
            )
            .await;
            assert_eq!(append.status, 200);
        })
        .await;
    });
}

/// A Pico create with a body writes the stream's first record, so it wakes subscriptions as an
/// append does.
#[test]
fn a_pico_create_with_a_body_wakes_a_subscription() {
    run_node(|core| async move {
        let node = Node::new(core);
        let settings = pico_settings(&node.subs);
        let core = &node.core;
        woken_by(&node, "p3", "first/*", || async {
            let create = crate::pico::handle(
                core,
                &settings,
                None,
                pico_request("PUT", "first/a", "{\"n\":1}"),
            )
            .await;
            assert_eq!(create.status, 201);
        })
        .await;
    });
}
