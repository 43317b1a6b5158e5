//! `pico admin ...` (README.md, "Admin commands") end to end: every command in text and
//! `--json` form against a real `pico serve`, the `<status>: <error>` refusals, the environment
//! and profile rules, the auth case, and the transfer success path (`--wait`) against a scripted
//! admin listener, since a single node refuses every transfer.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::cli::{check_outcome as check, pico_without_pico_env};
use common::{Conn, Server};
use serde_json::Value;

const FLAGS: &[&str] = &["--cores", "1"];

/// `pico ARGS` with no `PICO_*` from the test run, except `env`; the config file is a path
/// that does not exist, so no profile of the machine running the tests applies.
fn pico(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    pico_without_pico_env()
        .env("PICO_CONFIG", dir.join("no-config.toml"))
        .envs(env.iter().copied())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run pico")
}

fn admin_args<'a>(server_admin: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["admin", "--admin-endpoint", server_admin];
    all.extend_from_slice(args);
    all
}

/// stdout as JSON, after checking it is the pretty (multi-line) form.
#[track_caller]
fn json_stdout(out: &Output, what: &str) -> Value {
    assert_eq!(out.status.code(), Some(0), "{what}: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("{\n  \""),
        "{what}: not pretty JSON: {text}"
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"))
}

fn api(server: &Server, method: &str, path: &str, body: &str) -> Value {
    let response = Conn::connect(server.admin)
        .expect("connect to the admin listener")
        .request(method, path, &[], body.as_bytes())
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    response.expect(200);
    response.json()
}

/// `key=<digits>` becomes `key=#`, for values that move between two calls.
fn mask_number(text: &str, key: &str) -> String {
    let marker = format!("{key}=");
    let Some(at) = text.find(&marker) else {
        return text.to_owned();
    };
    let digits_from = at + marker.len();
    let digits = text[digits_from..]
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    assert!(digits > 0, "{key} is not a number in {text}");
    format!("{}#{}", &text[..digits_from], &text[digits_from + digits..])
}

/// A JSON field as the CLI prints it: strings bare, everything else as JSON.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[test]
fn every_command_prints_the_admin_api() {
    let server = Server::start(FLAGS);
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://{}", server.admin);
    server.put("/orders/eu", "text/plain").expect(201);
    for body in [&b"a"[..], b"bb", b"ccc"] {
        server.post("/orders/eu", body).expect(200);
    }
    server.put("/orders/us", "application/json").expect(201);
    let run = |args: &[&str]| pico(dir.path(), &admin_args(&endpoint, args), &[]);

    // cluster: two lines (no transfers pending on a single node). The object count moves
    // as segments seal in the background, so it is compared as "a number".
    let cluster = api(&server, "GET", "/admin/cluster", "");
    let expected = format!(
        "cluster={} node=1 epoch={} address=http://{} registered=true appliedIndex={}\n\
         streams=2 objects=# destroyedBacklog={} leaseHolder=null\n",
        shown(&cluster["clusterId"]),
        cluster["nodeEpoch"],
        server.addr,
        cluster["appliedIndex"],
        cluster["destroyedObjectBacklog"],
    );
    let out = run(&["cluster"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        mask_number(&String::from_utf8_lossy(&out.stdout), "objects"),
        expected
    );
    assert!(out.stderr.is_empty(), "{out:?}");
    let mut json = json_stdout(&run(&["--json", "cluster"]), "cluster --json");
    for volatile in ["uptimeMs", "objectCount"] {
        assert!(json[volatile].is_u64(), "{volatile} in {json}");
        json[volatile] = cluster[volatile].clone();
    }
    assert_eq!(json, cluster, "cluster --json is the API's answer");

    // nodes: one line, this node (its stream gauge refreshes within a moment).
    let nodes = common::wait_for(
        "the node to count 2 streams",
        Duration::from_secs(10),
        || {
            let nodes = api(&server, "GET", "/admin/nodes", "");
            (nodes["nodes"][0]["openingCount"] == 2).then_some(nodes)
        },
    );
    let node = &nodes["nodes"][0];
    let expected = format!(
        "node=1 epoch={} address=http://{} slots={} opening=2 placed=0 state=live lease=- (this node)\n",
        node["nodeEpoch"], server.addr, node["slots"]
    );
    check(&run(&["nodes"]), "nodes", 0, &expected, "");
    // Its help explains every column.
    let help = String::from_utf8_lossy(&run(&["nodes", "--help"]).stdout).into_owned();
    for column in [
        "node=", "epoch=", "address=", "slots=", "opening=", "placed=", "state=", "lease=",
    ] {
        assert!(help.contains(&format!("{column}<")), "{column} in {help}");
    }
    for state in ["live:", "expired:", "left:"] {
        assert!(help.contains(state), "{state} in {help}");
    }
    assert_eq!(
        json_stdout(&run(&["nodes", "--json"]), "nodes --json"),
        nodes
    );

    // stream: the name with or without its leading slash.
    let detail = api(&server, "GET", "/admin/streams/orders/eu", "");
    let expected = format!(
        "name=/orders/eu id={} owner=1 address=http://{} local=true\n\
         state=opened epoch={} start=0 end=3 closed=false type=text/plain\n",
        detail["streamId"], server.addr, detail["epoch"]
    );
    check(&run(&["stream", "/orders/eu"]), "stream", 0, &expected, "");
    check(
        &run(&["stream", "orders/eu"]),
        "stream, no slash",
        0,
        &expected,
        "",
    );
    assert_eq!(
        json_stdout(&run(&["stream", "/orders/eu", "--json"]), "stream --json"),
        detail
    );

    // A missing stream: the status and the server's error, exit 1, nothing on stdout.
    check(
        &run(&["stream", "/nope"]),
        "stream 404",
        1,
        "",
        "pico: not_found (404): stream /nope not found\n",
    );
    check(
        &run(&["--json", "stream", "/nope"]),
        "stream 404 --json",
        1,
        "",
        "pico: not_found (404): stream /nope not found\n",
    );

    // Transfers: a single node has nowhere to move a stream to.
    check(
        &run(&["transfer", "/orders/eu", "--to-node", "2"]),
        "transfer to an unknown node",
        1,
        "",
        "pico: bad_request (400): node 2 is not registered\n",
    );
    check(
        &run(&["transfer", "/orders/eu", "--to-node", "1", "--wait"]),
        "transfer to itself",
        1,
        "",
        "pico: bad_request (400): stream /orders/eu is already on node 1 (target equals source)\n",
    );
    check(
        &run(&["transfer", "/nope", "--to-node", "1"]),
        "transfer of a missing stream",
        1,
        "",
        "pico: not_found (404): stream /nope not found\n",
    );

    // set-slots: acknowledged on stderr, visible in the API.
    check(
        &run(&["set-slots", "1", "--slots", "5"]),
        "set-slots",
        0,
        "",
        "node=1 slots=5\n",
    );
    assert_eq!(
        api(&server, "GET", "/admin/nodes", "")["nodes"][0]["slots"],
        5
    );
    let out = run(&["--json", "set-slots", "1", "--slots", "7"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "node=1 slots=7\n");
    let json = json_stdout(&out, "set-slots --json");
    assert_eq!(json["slots"], 7);
    assert_eq!(json, api(&server, "GET", "/admin/nodes", "")["nodes"][0]);
    check(
        &run(&["set-slots", "9", "--slots", "1"]),
        "set-slots of an unknown node",
        1,
        "",
        "pico: not_found (404): node 9 is not registered\n",
    );
    // A required flag is a usage error (exit 2) before anything is sent.
    let out = run(&["set-slots", "1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn the_endpoint_comes_from_the_environment_and_profiles_do_not_apply() {
    let server = Server::start(FLAGS);
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://{}", server.admin);
    // PICO_PROFILE names a profile that does not exist and PICO_ENDPOINT a dead stream
    // endpoint: a stream command would fail on either, an admin command uses neither.
    let env = [
        ("PICO_ADMIN_ENDPOINT", endpoint.as_str()),
        ("PICO_PROFILE", "missing"),
        ("PICO_ENDPOINT", "http://127.0.0.1:1"),
    ];
    let node = &api(&server, "GET", "/admin/nodes", "")["nodes"][0];
    let out = pico(dir.path(), &["admin", "nodes"], &env);
    check(
        &out,
        "nodes via PICO_ADMIN_ENDPOINT",
        0,
        &format!(
            "node=1 epoch={} address=http://{} slots={} opening=0 placed=0 state=live lease=- (this node)\n",
            node["nodeEpoch"], server.addr, node["slots"],
        ),
        "",
    );
    // PICO_JSON is --json; the flag wins over the variable for the endpoint.
    let out = pico(
        dir.path(),
        &["admin", "cluster", "--admin-endpoint", &endpoint],
        &[
            ("PICO_JSON", "1"),
            ("PICO_ADMIN_ENDPOINT", "http://127.0.0.1:1"),
        ],
    );
    assert_eq!(json_stdout(&out, "PICO_JSON")["nodeId"], 1);

    // Nothing listening: a transport error, exit 1.
    let out = pico(
        dir.path(),
        &["admin", "--admin-endpoint", "http://127.0.0.1:1", "cluster"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("pico: admin request failed: ") && stderr.contains("refused"),
        "{stderr}"
    );
    // With what to check and where the endpoint came from.
    assert!(
        stderr.contains("admin listener at http://127.0.0.1:1?")
            && stderr.contains("--admin-endpoint"),
        "{stderr}"
    );
    // Not an HTTP URL: a usage error.
    let out = pico(
        dir.path(),
        &["admin", "--admin-endpoint", "ftp://h", "nodes"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn with_auth_required_the_admin_token_is_needed() {
    let (server, _tokens) = common::start_with_tokens(
        "ops-secret / admin\nwriter-secret / read,append\n",
        &["--cores", "1"],
    );
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://{}", server.admin);
    let run =
        |args: &[&str], env: &[(&str, &str)]| pico(dir.path(), &admin_args(&endpoint, args), env);

    check(
        &run(&["cluster"], &[]),
        "no token",
        1,
        "",
        "pico: unauthorized (401): a valid bearer token is required\n",
    );
    check(
        &run(&["cluster", "--token", "writer-secret"], &[]),
        "a token without the admin grant",
        1,
        "",
        "pico: forbidden (403): an admin token is required\n",
    );
    let out = run(&["cluster", "--token", "ops-secret"], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("cluster="),
        "{out:?}"
    );
    let out = run(
        &["set-slots", "1", "--slots", "3"],
        &[("PICO_TOKEN", "ops-secret")],
    );
    check(&out, "PICO_TOKEN", 0, "", "node=1 slots=3\n");
    // The token is never printed, even in a refusal.
    let out = run(&["stream", "/nope", "--token", "ops-secret"], &[]);
    check(
        &out,
        "404 with a token",
        1,
        "",
        "pico: not_found (404): stream /nope not found\n",
    );
}

/// One request as the scripted listener saw it.
#[derive(Debug)]
struct Seen {
    request_line: String,
    head: String,
    body: String,
}

/// An admin listener that answers each request with the next of `answers` (status, JSON
/// body), closing every connection, and reports what it received.
fn scripted(answers: Vec<(u16, String)>) -> (String, mpsc::Receiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for (status, body) in answers {
            let Ok((socket, _)) = listener.accept() else {
                return;
            };
            let Some(seen) = answer(socket, status, &body) else {
                return;
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    (endpoint, rx)
}

fn answer(mut socket: TcpStream, status: u16, body: &str) -> Option<Seen> {
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let (head, request_body) = common::read_request(&mut socket, 1 << 20)?;
    let response = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(response.as_bytes()).ok()?;
    Some(Seen {
        request_line: head.lines().next().unwrap_or_default().to_owned(),
        body: String::from_utf8_lossy(&request_body).into_owned(),
        head,
    })
}

/// The success path a single node cannot show: 202 accepted, then `--wait` polls the stream
/// until the transfer has settled on the target.
#[test]
fn transfer_waits_until_the_stream_settles_on_the_target() {
    let stream = |node: u64, pending: &str| {
        format!(
            r#"{{"name":"/moving","streamId":7,"nodeId":{node},"ownerNodeId":{node},"pendingTransfer":{pending}}}"#
        )
    };
    let (endpoint, seen) = scripted(vec![
        (
            202,
            r#"{"stream":"/moving","streamId":7,"toNode":2,"pending":true}"#.into(),
        ),
        (200, stream(1, r#"{"fromNode":1,"toNode":2}"#)),
        // Settled on the row but not yet on the target: keep waiting.
        (200, stream(1, "null")),
        (200, stream(2, "null")),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let out = pico(
        dir.path(),
        &[
            "admin",
            "transfer",
            "moving",
            "--to-node",
            "2",
            "--wait",
            "--admin-endpoint",
            &endpoint,
            "--token",
            "t0k",
        ],
        &[],
    );
    check(
        &out,
        "transfer --wait",
        0,
        "",
        "transfer accepted stream=/moving id=7 to=2\ntransfer complete\n",
    );
    // The listener reports a request after answering it, so the last report may trail the exit.
    let requests: Vec<Seen> = (0..4)
        .map(|i| {
            seen.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("request {i} of 4 was not seen"))
        })
        .collect();
    assert_eq!(requests[0].request_line, "POST /admin/transfer HTTP/1.1");
    let body: Value = serde_json::from_str(&requests[0].body).unwrap();
    assert_eq!(body, serde_json::json!({"stream": "/moving", "toNode": 2}));
    for request in &requests {
        assert!(
            request
                .head
                .to_ascii_lowercase()
                .contains("\r\nauthorization: bearer t0k\r\n"),
            "{request:?}"
        );
    }
    for request in &requests[1..] {
        assert_eq!(request.request_line, "GET /admin/streams/moving HTTP/1.1");
    }

    // Without --wait: one request; --json puts the answer on stdout.
    let (endpoint, seen) = scripted(vec![(
        202,
        r#"{"stream":"/moving","streamId":7,"toNode":2,"pending":true}"#.into(),
    )]);
    let out = pico(
        dir.path(),
        &[
            "admin",
            "--json",
            "--admin-endpoint",
            &endpoint,
            "transfer",
            "/moving",
            "--to-node",
            "2",
        ],
        &[],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "transfer accepted stream=/moving id=7 to=2\n"
    );
    assert_eq!(json_stdout(&out, "transfer --json")["pending"], true);
    assert!(seen.recv_timeout(Duration::from_secs(10)).is_ok());
}
