//! Durable Streams subscriptions across a restart of a real `pico serve --protocol ds`: the
//! definitions, links, acked offsets, wake generations and the node's keys are in the state
//! files (`<wal-dir>/subscriptions.json` and `subscriptions.d/`), so after a SIGKILL and a start on the same
//! directories every subscription answers as before, the JWKS names the same key, a callback
//! token of before the restart is fenced (not invalid), and writes wake the subscriptions again.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{ds, ds_read, wait_for, Resp, Server};
use serde_json::{json, Value};

const ROOT: &str = "/v1/stream/";

/// A webhook POST as the receiver got it.
struct Delivery {
    signature: String,
    body: Value,
}

/// A webhook receiver on loopback: answers every POST `200 {}` (the wake is then settled by a
/// callback) and hands the deliveries over. Lives as long as the test process.
fn receiver() -> (String, mpsc::Receiver<Delivery>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook receiver");
    let url = format!(
        "http://127.0.0.1:{}/hook",
        listener.local_addr().unwrap().port()
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let parsed = common::read_request(&mut conn, 1 << 20).map(|(head, body)| {
                let signature = common::header_of(&head, "webhook-signature").unwrap_or_default();
                (signature.to_string(), body)
            });
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
            );
            if let Some((signature, body)) = parsed {
                let body = serde_json::from_slice(&body).expect("a JSON delivery");
                if tx.send(Delivery { signature, body }).is_err() {
                    return;
                }
            }
        }
    });
    (url, rx)
}

fn next_delivery(rx: &mpsc::Receiver<Delivery>, server: &Server) -> Delivery {
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("no webhook delivery ({e}); log:\n{}", server.log()))
}

fn control(
    addr: SocketAddr,
    method: &str,
    rest: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Resp {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    common::json_request(
        addr,
        method,
        &format!("{ROOT}__ds/{rest}"),
        token,
        body.as_bytes(),
    )
}

fn get_subscription(server: &Server, id: &str) -> Value {
    let got = control(
        server.addr,
        "GET",
        &format!("subscriptions/{id}"),
        None,
        None,
    );
    got.expect(200);
    got.json()
}

/// Appends `body` to a text stream; its new tail offset.
fn write(server: &Server, path: &str, body: &str) -> String {
    let appended = ds(
        server.addr,
        "POST",
        &format!("{ROOT}{path}"),
        &[("content-type", "text/plain")],
        body.as_bytes(),
    );
    appended.expect(204);
    appended.h("stream-next-offset").to_string()
}

/// The JSON stream `wake/pool`, where the tests' pull-wake subscriptions announce their wakes.
fn create_wake_pool(server: &Server) {
    ds(
        server.addr,
        "PUT",
        &format!("{ROOT}wake/pool"),
        &[("content-type", "application/json")],
        b"",
    )
    .expect(201);
}

/// A pull-wake claim of `subscription` by `worker`: the claim's answer.
fn claim(server: &Server, subscription: &str, worker: &str) -> Value {
    let claimed = control(
        server.addr,
        "POST",
        &format!("subscriptions/{subscription}/claim"),
        None,
        Some(json!({"worker": worker})),
    );
    claimed.expect(200);
    claimed.json()
}

/// Acknowledges `offset` of `stream` under `claim` and ends the wake; the answer.
fn ack_done(
    server: &Server,
    subscription: &str,
    claim: &Value,
    stream: &str,
    offset: &str,
) -> Resp {
    let ack = json!({"wake_id": claim["wake_id"], "generation": claim["generation"],
        "acks": [{"stream": stream, "offset": offset}], "done": true});
    control(
        server.addr,
        "POST",
        &format!("subscriptions/{subscription}/ack"),
        claim["token"].as_str(),
        Some(ack),
    )
}

/// The wake events of `subscription` in the wake stream so far.
fn wake_events(server: &Server, subscription: &str) -> Vec<Value> {
    let read = ds_read(server.addr, &format!("{ROOT}wake/pool"), "-1");
    read.expect(200);
    read.json()
        .as_array()
        .expect("a JSON stream reads as an array")
        .iter()
        .filter(|event| event["subscription_id"] == subscription)
        .cloned()
        .collect()
}

/// Waits for the wake event of `generation` of `subscription`.
fn wait_wake(server: &Server, subscription: &str, generation: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = wake_events(server, subscription);
        if let Some(event) = events.iter().find(|e| e["generation"] == generation) {
            return event.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no wake event of generation {generation} for {subscription}: {events:?}; log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn subscriptions_survive_a_restart() {
    let mut server = Server::start(&["--protocol", "ds"]);
    let (url, deliveries) = receiver();
    let state_file = server.wal_dir().join("subscriptions.json");
    assert!(
        server.log().contains(&format!(
            "subscriptions: 0 loaded from {}",
            state_file.display()
        )),
        "{}",
        server.log()
    );
    for (path, content_type) in [
        ("wake/pool", "application/json"),
        ("events/a", "text/plain"),
    ] {
        ds(
            server.addr,
            "PUT",
            &format!("{ROOT}{path}"),
            &[("content-type", content_type)],
            b"",
        )
        .expect(201);
    }

    // A pull-wake and a webhook subscription on the same pattern; the webhook also links a
    // stream explicitly, after its creation.
    let pull_spec = json!({"type": "pull-wake", "pattern": "events/*",
        "wake_stream": "wake/pool", "lease_ttl_ms": 5000});
    control(
        server.addr,
        "PUT",
        "subscriptions/pull",
        None,
        Some(pull_spec.clone()),
    )
    .expect(201);
    let hook_spec = json!({"type": "webhook", "pattern": "events/*",
        "webhook": {"url": url}, "description": "survives restarts"});
    control(
        server.addr,
        "PUT",
        "subscriptions/hook",
        None,
        Some(hook_spec.clone()),
    )
    .expect(201);
    control(
        server.addr,
        "POST",
        "subscriptions/hook/streams",
        None,
        Some(json!({"streams": ["orders/1"]})),
    )
    .expect(204);

    // One write wakes both; each acks it.
    let tail = write(&server, "events/a", "one");
    let event = wait_wake(&server, "pull", 1);
    assert_eq!(event["stream"], "events/a");
    let claimed = claim(&server, "pull", "w1");
    let acked = ack_done(&server, "pull", &claimed, "events/a", &tail);
    acked.expect(200);
    assert_eq!(acked.json(), json!({"ok": true, "next_wake": false}));

    let delivery = next_delivery(&deliveries, &server);
    assert_eq!(delivery.body["subscription_id"], "hook");
    assert_eq!(delivery.body["generation"], 1);
    let callback_token = delivery.body["callback_token"]
        .as_str()
        .unwrap()
        .to_string();
    let callback = json!({"wake_id": delivery.body["wake_id"],
        "generation": delivery.body["generation"],
        "acks": [{"stream": "events/a", "offset": tail}], "done": true});
    let settled = control(
        server.addr,
        "POST",
        "subscriptions/hook/callback",
        Some(&callback_token),
        Some(callback.clone()),
    );
    settled.expect(200);

    let pull_before = get_subscription(&server, "pull");
    let hook_before = get_subscription(&server, "hook");
    assert_eq!(
        pull_before["streams"],
        json!([{"path": "events/a", "link_type": "glob", "acked_offset": tail}])
    );
    assert_eq!(
        hook_before["streams"],
        json!([
            {"path": "events/a", "link_type": "glob", "acked_offset": tail},
            {"path": "orders/1", "link_type": "explicit",
                "acked_offset": "0000000000000000_0000000000000000"},
        ])
    );
    let jwks_before = control(server.addr, "GET", "jwks.json", None, None);
    jwks_before.expect(200);
    let kid = jwks_before.json()["keys"][0]["kid"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(delivery.signature.contains(&format!("kid={kid},")));
    // The file holds keys: only the node's user may read it.
    let mode = std::fs::metadata(&state_file)
        .expect("the state file exists once there are subscriptions")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // kill -9: nothing is written on the way out.
    server.restart();
    assert!(
        server.log().contains(&format!(
            "subscriptions: 2 loaded from {}",
            state_file.display()
        )),
        "{}",
        server.log()
    );
    assert_eq!(get_subscription(&server, "pull"), pull_before);
    assert_eq!(get_subscription(&server, "hook"), hook_before);
    let jwks_after = control(server.addr, "GET", "jwks.json", None, None);
    jwks_after.expect(200);
    assert_eq!(jwks_after.json(), jwks_before.json());
    // Re-creating with the same definition confirms the restored subscription.
    control(
        server.addr,
        "PUT",
        "subscriptions/pull",
        None,
        Some(pull_spec),
    )
    .expect(200);
    control(
        server.addr,
        "PUT",
        "subscriptions/hook",
        None,
        Some(hook_spec),
    )
    .expect(200);
    // The token key survived: an old token still verifies, and its wake is over.
    let stale = control(
        server.addr,
        "POST",
        "subscriptions/hook/callback",
        Some(&callback_token),
        Some(callback),
    );
    assert_eq!(stale.status, 409, "{}", stale.describe());
    assert_eq!(stale.json()["error"]["code"], "FENCED");

    // Nothing was pending, so nothing woke at start; a new write wakes both, with the next
    // generation.
    assert_eq!(wake_events(&server, "pull").len(), 1);
    let tail2 = write(&server, "events/a", "two");
    let event = wait_wake(&server, "pull", 2);
    assert_eq!(event["stream"], "events/a");
    let delivery = next_delivery(&deliveries, &server);
    assert_eq!(delivery.body["subscription_id"], "hook");
    assert_eq!(delivery.body["generation"], 2);
    assert!(delivery.signature.contains(&format!("kid={kid},")));
    let streams = delivery.body["streams"].as_array().unwrap();
    let events_a = streams.iter().find(|s| s["path"] == "events/a").unwrap();
    assert_eq!(events_a["acked_offset"], tail.as_str());
    assert_eq!(events_a["tail_offset"], tail2.as_str());
    assert_eq!(events_a["has_pending"], true);

    // Deleting is durable too. The pull-wake wake of generation 2 is still unclaimed: it does
    // not survive the restart, but its pending work is announced again, as generation 3.
    control(server.addr, "DELETE", "subscriptions/hook", None, None).expect(204);
    server.restart();
    control(server.addr, "GET", "subscriptions/hook", None, None).expect(404);
    let event = wait_wake(&server, "pull", 3);
    assert_eq!(event["stream"], "events/a");
    let claim = claim(&server, "pull", "w2");
    assert_eq!(claim["generation"], 3);
    assert_eq!(claim["streams"][0]["acked_offset"], tail.as_str());
    assert_eq!(claim["streams"][0]["tail_offset"], tail2.as_str());
}

#[test]
fn a_corrupt_state_file_stops_the_node() {
    let mut server = Server::start(&["--protocol", "ds"]);
    server.kill();
    let state_file = server.wal_dir().join("subscriptions.json");
    std::fs::write(&state_file, b"{\"format\": 1, \"subscriptions\": [").unwrap();
    let output = common::pico(
        server.dir(),
        &[
            "serve",
            "--protocol",
            "ds",
            "--listen",
            "127.0.0.1:0",
            "--meta-url",
            &format!("sqlite:{}", server.dir().join("meta.db").display()),
            "--storage",
            &format!("-2@file://{}", server.dir().join("objects").display()),
            "--wal-dir",
            &server.wal_dir().display().to_string(),
        ],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&state_file.display().to_string()),
        "the error names the file: {stderr}"
    );
    // The file is left as it was, for the operator to look at.
    assert_eq!(
        std::fs::read(&state_file).unwrap(),
        b"{\"format\": 1, \"subscriptions\": ["
    );
}

#[test]
fn links_and_generations_made_by_writes_are_written_soon_after() {
    let mut server = Server::start(&["--protocol", "ds"]);
    create_wake_pool(&server);
    let spec = json!({"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wake/pool"});
    control(server.addr, "PUT", "subscriptions/lazy", None, Some(spec)).expect(201);
    // The write links the new stream and starts a wake: neither waits for the disk, the
    // sweeper writes them within its interval.
    ds(
        server.addr,
        "PUT",
        &format!("{ROOT}jobs/new"),
        &[("content-type", "text/plain")],
        b"",
    )
    .expect(201);
    let tail = write(&server, "jobs/new", "work");
    wait_wake(&server, "lazy", 1);
    let before = get_subscription(&server, "lazy");
    assert_eq!(
        before["streams"],
        json!([{"path": "jobs/new", "link_type": "glob", "acked_offset": "-1"}])
    );
    // Written by the sweeper, not by the write: the state file gets the link (and the wake,
    // made by the same write) without another request. Waited for, not slept on, so that a
    // busy machine's late sweep is not mistaken for a lost one.
    // Each subscription has a file of its own in subscriptions.d. Only renamed files count: a
    // `*.tmp` is a write still under way (a kill now would leave it unread by the restart).
    let state_dir = server.wal_dir().join("subscriptions.d");
    wait_for(
        "the sweeper to write the link",
        Duration::from_secs(30),
        || {
            let files = std::fs::read_dir(&state_dir).ok()?;
            let state: String = files
                .filter_map(|file| {
                    let path = file.ok()?.path();
                    let written = path.extension().is_none_or(|ext| ext != "tmp");
                    written.then(|| std::fs::read_to_string(path).ok())?
                })
                .collect();
            state.contains("jobs/new").then_some(())
        },
    );
    server.restart();
    assert_eq!(get_subscription(&server, "lazy"), before);
    // The unclaimed wake is announced again with the next generation.
    wait_wake(&server, "lazy", 2);
    let claimed = claim(&server, "lazy", "w");
    assert_eq!(claimed["streams"][0]["tail_offset"], tail.as_str());
}

/// A subscription belongs to its root, so a token with admin on `/a/` can neither describe,
/// claim, ack, relink or delete `/b/`'s subscriptions through `/a/__ds/subscriptions/<id>` nor
/// probe which ids exist (as it could were ids node-wide and the grant checked only on the
/// request's own root): through another root every verb answers
/// `404` exactly as for an id nobody uses (`DELETE`: `204`, as for any unknown id), and the
/// same id under `/a/` is `/a/`'s own.
fn expect_not_found(got: &Resp) {
    got.expect(404);
    assert_eq!(
        got.json()["error"]["code"],
        "SUBSCRIPTION_NOT_FOUND",
        "{}",
        got.describe()
    );
}

#[test]
fn a_tenant_cannot_reach_another_roots_subscriptions() {
    let (server, _tokens) = common::start_with_tokens(
        "ta /v1/stream/a/ read,append,admin\ntb /v1/stream/b/ read,append,admin\n",
        &["--protocol", "ds"],
    );
    let call = |method: &str, path: &str, token: &str, body: Option<Value>| {
        let auth = format!("Bearer {token}");
        let headers = [
            ("content-type", "application/json"),
            ("authorization", auth.as_str()),
        ];
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        ds(server.addr, method, path, &headers, body.as_bytes())
    };
    let text = |method: &str, path: &str, body: &[u8]| {
        let headers = [
            ("content-type", "text/plain"),
            ("authorization", "Bearer tb"),
        ];
        ds(server.addr, method, path, &headers, body)
    };
    const A: &str = "/v1/stream/a/__ds/subscriptions";
    const B: &str = "/v1/stream/b/__ds/subscriptions";
    text("PUT", "/v1/stream/b/events/a", b"").expect(201);
    let spec = json!({"type": "pull-wake", "pattern": "events/*", "wake_stream": "wake/pool",
        "lease_ttl_ms": 60_000});
    call("PUT", &format!("{B}/x"), "tb", Some(spec.clone())).expect(201);
    text("POST", "/v1/stream/b/events/a", b"one").expect(204);
    let described = call("GET", &format!("{B}/x"), "tb", None);
    described.expect(200);
    let acked = described.json()["streams"][0]["acked_offset"].clone();

    // A foreign id answers as an unknown one does, body and all.
    let unknown = call("GET", &format!("{A}/nobody"), "ta", None);
    let foreign = call("GET", &format!("{A}/x"), "ta", None);
    expect_not_found(&foreign);
    assert_eq!(
        (foreign.status, foreign.json()),
        (unknown.status, unknown.json())
    );
    let streams = json!({"streams": ["events/b"]});
    expect_not_found(&call(
        "POST",
        &format!("{A}/x/streams"),
        "ta",
        Some(streams),
    ));
    expect_not_found(&call(
        "DELETE",
        &format!("{A}/x/streams/events%2Fa"),
        "ta",
        None,
    ));
    let worker = json!({"worker": "thief"});
    expect_not_found(&call("POST", &format!("{A}/x/claim"), "ta", Some(worker)));
    // Through its own root, the claim is there to take.
    let claimed = call(
        "POST",
        &format!("{B}/x/claim"),
        "tb",
        Some(json!({"worker": "w"})),
    );
    claimed.expect(200);
    let claimed = claimed.json();
    let token = claimed["token"].as_str().unwrap().to_string();
    let tail = claimed["streams"][0]["tail_offset"].clone();
    // Even the lease's own token reaches it only through its root: no ack moves /b/'s cursor
    // from /a/.
    let ack = json!({"wake_id": claimed["wake_id"], "generation": claimed["generation"],
        "acks": [{"path": "events/a", "offset": tail}], "done": true});
    for action in ["ack", "release", "callback"] {
        expect_not_found(&call(
            "POST",
            &format!("{A}/x/{action}"),
            &token,
            Some(ack.clone()),
        ));
    }
    let described = call("GET", &format!("{B}/x"), "tb", None);
    described.expect(200);
    assert_eq!(described.json()["streams"][0]["acked_offset"], acked);
    // Deleting an unknown id is 204 whoever asks; /b/'s subscription stays.
    call("DELETE", &format!("{A}/x"), "ta", None).expect(204);
    call("GET", &format!("{B}/x"), "tb", None).expect(200);
    // The same id under /a/ is /a/'s own, whatever /b/ configured.
    let other = json!({"type": "pull-wake", "pattern": "other/*", "wake_stream": "wake/a"});
    call("PUT", &format!("{A}/x"), "ta", Some(other)).expect(201);
    assert_eq!(
        call("GET", &format!("{A}/x"), "ta", None).json()["pattern"],
        "other/*"
    );
    assert_eq!(
        call("GET", &format!("{B}/x"), "tb", None).json()["pattern"],
        "events/*"
    );
    // And /a/'s token still gets nothing under /b/.
    call("GET", &format!("{B}/x"), "ta", None).expect(403);
    call("POST", &format!("{B}/x/ack"), &token, Some(ack)).expect(200);
}

/// A webhook that points at the node's own Durable Streams listener: its deliveries fail
/// (the log says why) instead of appending each wake, callback token and all, to the stream
/// it watches, which wakes it again, for ever.
#[test]
fn a_webhook_to_the_node_itself_is_refused_not_looped() {
    let server = Server::start(&["--protocol", "ds"]);
    let created = ds(
        server.addr,
        "PUT",
        &format!("{ROOT}loop"),
        &[("content-type", "application/json")],
        b"",
    );
    assert_eq!(created.status, 201, "{}", created.describe());
    let own = format!("http://{}{ROOT}loop", server.addr);
    let subscription = control(
        server.addr,
        "PUT",
        "subscriptions/loop",
        None,
        Some(json!({
            "type": "webhook", "webhook": {"url": own}, "streams": ["loop"],
            "lease_ttl_ms": 1000,
        })),
    );
    assert!(subscription.status < 300, "{}", subscription.describe());
    let appended = ds(
        server.addr,
        "POST",
        &format!("{ROOT}loop"),
        &[("content-type", "application/json")],
        b"[{\"n\":1}]",
    );
    assert!(appended.status < 300, "{}", appended.describe());
    wait_for(
        "the delivery's refusal in the log",
        Duration::from_secs(20),
        || server.log().contains("own listener").then_some(()),
    );
    // Some tries later, the stream still holds the one append.
    std::thread::sleep(Duration::from_secs(3));
    let read = ds_read(server.addr, &format!("{ROOT}loop"), "-1");
    read.expect(200);
    assert_eq!(read.json(), json!([{"n": 1}]), "{}", read.text());
}

/// A linked stream that expires (the node's reaper deletes it, no `DELETE` request tells the
/// subscriptions) and is created again: its new records are work from the first one, and a
/// claim starts the worker at the new stream's beginning, not where it stood in the old one
/// (which would skip the new stream's first records).
#[test]
fn a_linked_stream_that_expired_and_was_created_again_is_work_from_its_first_record() {
    let server = Server::start(&["--protocol", "ds"]);
    create_wake_pool(&server);
    let spec = json!({"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wake/pool",
        "lease_ttl_ms": 5000});
    control(server.addr, "PUT", "subscriptions/again", None, Some(spec)).expect(201);
    ds(
        server.addr,
        "PUT",
        &format!("{ROOT}jobs/x"),
        &[("content-type", "text/plain"), ("stream-ttl", "1")],
        b"",
    )
    .expect(201);
    let mut tail = String::new();
    for i in 0..3 {
        tail = write(&server, "jobs/x", &format!("old-{i}"));
    }
    wait_wake(&server, "again", 1);
    let claimed = claim(&server, "again", "w");
    ack_done(&server, "again", &claimed, "jobs/x", &tail).expect(200);

    wait_for("the stream to expire", Duration::from_secs(30), || {
        let head = ds(server.addr, "HEAD", &format!("{ROOT}jobs/x"), &[], b"");
        (head.status == 404).then_some(())
    });
    ds(
        server.addr,
        "PUT",
        &format!("{ROOT}jobs/x"),
        &[("content-type", "text/plain")],
        b"",
    )
    .expect(201);
    write(&server, "jobs/x", "new-0");
    wait_wake(&server, "again", 2);
    let claimed = claim(&server, "again", "w");
    let stream = &claimed["streams"][0];
    assert_eq!(stream["path"], "jobs/x", "{stream}");
    assert_eq!(stream["acked_offset"], "-1", "{stream}");
}
