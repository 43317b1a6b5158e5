//! `pico admin` (README.md, "Admin commands"): the admin API of one node, formatted as
//! `key=value` lines.
//!
//! Talks to the admin listener directly with reqwest (the stream client knows nothing of the
//! admin API). Data goes to stdout, acknowledgements to stderr; a non-2xx answer prints
//! `<status>: <error>` on stderr and exits 1.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use pico_client::{build_http_client, ApiError, ClientConfig, ClientError};
use reqwest::{Method, Url};
use serde_json::{json, Value};

use crate::args::{
    AdminArgs, AdminBackupArgs, AdminCommand, AdminRestoreArgs, AdminVerifyArgs, QuarantineCommand,
};
use crate::Failure;

pub const DEFAULT_ADMIN_ENDPOINT: &str = "http://127.0.0.1:9090";
/// `transfer --wait`: how often the stream is looked at, and for how long.
const WAIT_POLL: Duration = Duration::from_millis(250);
const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// How long a backup may take when `--timeout-sec` is not given (the node's default).
const BACKUP_TIMEOUT_SEC_DEFAULT: u64 = pico_net::BACKUP_TIMEOUT_SEC_DEFAULT;
/// How much longer than the backup's own time limit the command waits for the answer.
const BACKUP_ANSWER_MARGIN_SEC: u64 = 30;
/// How long a verify may take when `--timeout-sec` is not given (the node's default).
const VERIFY_TIMEOUT_SEC_DEFAULT: u64 = pico_net::VERIFY_TIMEOUT_SEC_DEFAULT;
/// How often `pico admin backup` and `verify` ask how their job stands.
const JOB_POLL: Duration = Duration::from_millis(200);

/// The admin listener of one node.
struct Admin {
    http: reqwest::Client,
    /// Without a trailing `/`.
    base: String,
}

pub fn run(args: &AdminArgs, token: Option<&str>, ca_cert: Option<&[u8]>) -> Result<(), Failure> {
    if let AdminCommand::Restore(restore_args) = &args.command {
        return restore(args.json, restore_args);
    }
    let endpoint = args
        .admin_endpoint
        .as_deref()
        .unwrap_or(DEFAULT_ADMIN_ENDPOINT);
    let admin = Admin::new(endpoint, token, ca_cert)?;
    // One request at a time: a single-threaded runtime is enough.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Fatal(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        match &args.command {
            AdminCommand::Cluster(_) => {
                let body = admin.call(Method::GET, "/admin/cluster", None).await?;
                print(args.json, &body, cluster_lines)
            }
            AdminCommand::Nodes(_) => {
                let body = admin.call(Method::GET, "/admin/nodes", None).await?;
                print(args.json, &body, nodes_lines)
            }
            AdminCommand::Stream(stream) => {
                let body = admin.stream(&stream.stream).await?;
                print(args.json, &body, stream_lines)
            }
            AdminCommand::Transfer(transfer) => {
                let name = stream_name(&transfer.stream);
                let request = json!({ "stream": name, "toNode": transfer.to_node });
                let body = admin
                    .call(Method::POST, "/admin/transfer", Some(request))
                    .await?;
                if args.json {
                    print(true, &body, |_| Vec::new())?;
                }
                eprintln!(
                    "transfer accepted stream={name} id={} to={}",
                    field(&body, "streamId"),
                    transfer.to_node
                );
                if transfer.wait {
                    admin.wait_settled(&name, transfer.to_node).await?;
                    eprintln!("transfer complete");
                }
                Ok(())
            }
            AdminCommand::Quarantine(quarantine) => match &quarantine.command {
                QuarantineCommand::Ls(_) => {
                    let body = admin.call(Method::GET, "/admin/quarantine", None).await?;
                    print(args.json, &body, quarantine_lines)
                }
                QuarantineCommand::Export(entry) => {
                    let path = format!(
                        "/admin/quarantine/records?{}",
                        entry_query(&entry.segment, entry.stream_id)
                    );
                    let body = admin.call(Method::GET, &path, None).await?;
                    print(args.json, &body, |body| {
                        let records = body["records"].as_array().into_iter().flatten();
                        records.map(Value::to_string).collect()
                    })
                }
                QuarantineCommand::Release(entry) => {
                    let path = format!(
                        "/admin/quarantine?{}",
                        entry_query(&entry.segment, entry.stream_id)
                    );
                    let body = admin.call(Method::DELETE, &path, None).await?;
                    if args.json {
                        print(true, &body, |_| Vec::new())?;
                    }
                    eprintln!(
                        "released segment={} stream={}",
                        entry.segment, entry.stream_id
                    );
                    Ok(())
                }
            },
            AdminCommand::Backup(backup) => {
                let body = admin.backup(backup).await?;
                print(args.json, &body, backup_lines)
            }
            AdminCommand::Verify(verify) => {
                let report = admin.verify(verify).await?;
                print(args.json, &report, verify_lines)?;
                let damaged = report["damagedObjects"].as_u64().unwrap_or(0);
                let unreadable = report["unreadableObjects"].as_u64().unwrap_or(0);
                if damaged + unreadable > 0 {
                    return Err(Failure::Fatal(format!(
                        "the verify found {damaged} damaged and {unreadable} unreadable objects"
                    )));
                }
                Ok(())
            }
            AdminCommand::Checkpoint(checkpoint) => {
                let mut request = json!({});
                if let Some(timeout_sec) = checkpoint.timeout_sec {
                    request["timeoutSec"] = json!(timeout_sec);
                }
                let wait = checkpoint
                    .timeout_sec
                    .unwrap_or(BACKUP_TIMEOUT_SEC_DEFAULT)
                    .saturating_add(BACKUP_ANSWER_MARGIN_SEC);
                let body = admin
                    .call_with_timeout(
                        Method::POST,
                        "/admin/checkpoint",
                        Some(request),
                        Some(Duration::from_secs(wait)),
                    )
                    .await?;
                print(args.json, &body, |b| {
                    vec![format!(
                        "startedAtMs={} checkpointedAtMs={}",
                        field(b, "startedAtMs"),
                        field(b, "checkpointedAtMs")
                    )]
                })
            }
            AdminCommand::GcHold(hold) => {
                let request = json!({ "seconds": hold.seconds });
                let body = admin
                    .call(Method::POST, "/admin/gc-hold", Some(request))
                    .await?;
                print(args.json, &body, gc_hold_lines)
            }
            AdminCommand::GcRelease(_) => {
                let body = admin.call(Method::DELETE, "/admin/gc-hold", None).await?;
                print(args.json, &body, gc_hold_lines)
            }
            // Answered above: a restore does not talk to a node.
            AdminCommand::Restore(_) => Ok(()),
            AdminCommand::SetSlots(set) => {
                let request = json!({ "slots": set.slots });
                let path = format!("/admin/nodes/{}", set.node);
                let body = admin.call(Method::POST, &path, Some(request)).await?;
                if args.json {
                    print(true, &body, |_| Vec::new())?;
                }
                eprintln!(
                    "node={} slots={}",
                    field(&body, "nodeId"),
                    field(&body, "slots")
                );
                Ok(())
            }
        }
    })
}

impl Admin {
    fn new(endpoint: &str, token: Option<&str>, ca_cert: Option<&[u8]>) -> Result<Admin, Failure> {
        let mut config = ClientConfig::new(endpoint);
        config.request_timeout = Duration::from_secs(30);
        config.token = token.map(str::to_owned);
        config.ca_cert_pem = ca_cert.map(<[u8]>::to_vec);
        let (base, http) = build_http_client(&config, "--admin-endpoint").map_err(|e| {
            let message = e.to_string();
            if message.starts_with("invalid --admin-endpoint") {
                Failure::Usage(message)
            } else {
                Failure::Fatal(message)
            }
        })?;
        Ok(Admin { http, base })
    }

    /// One request; the JSON body of a 2xx answer, else the error in the form every command
    /// uses (`not_found (404): stream /x not found`).
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        self.call_with_timeout(method, path, body, None).await
    }

    /// [`Admin::call`], waiting `timeout` for the answer instead of the client's default.
    async fn call_with_timeout(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        timeout: Option<Duration>,
    ) -> Result<Value, Failure> {
        let url = Url::parse(&format!("{}{path}", self.base))
            .map_err(|e| Failure::Usage(format!("invalid admin path {path:?}: {e}")))?;
        let mut request = self.http.request(method, url);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let transport = |e: reqwest::Error| self.transport(e);
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            let error = ApiError::from_status(status.as_u16(), error_text(status, &bytes));
            return Err(ClientError::Api(error).into());
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            Failure::Fatal(format!(
                "the admin listener answered {path} with no JSON: {e}"
            ))
        })
    }

    /// `POST /admin/backup`, then `GET /admin/backup` until this backup ended (at most its
    /// `timeoutSec` and a little more); its summary, or its error as a failure.
    async fn backup(&self, args: &AdminBackupArgs) -> Result<Value, Failure> {
        let mut request = json!({ "to": args.to.display().to_string() });
        let wait = job_bounds(
            &mut request,
            args.timeout_sec,
            args.max_bytes_per_second,
            BACKUP_TIMEOUT_SEC_DEFAULT,
        );
        let what = format!("the backup to {}", args.to.display());
        self.run_to_end("/admin/backup", request, wait, &what).await
    }

    /// `POST /admin/verify`, then `GET /admin/verify` until it ended; its report, or its
    /// error as a failure.
    async fn verify(&self, args: &AdminVerifyArgs) -> Result<Value, Failure> {
        let mut request = json!({});
        let wait = job_bounds(
            &mut request,
            args.timeout_sec,
            args.max_bytes_per_second,
            VERIFY_TIMEOUT_SEC_DEFAULT,
        );
        self.run_to_end("/admin/verify", request, wait, "the verify")
            .await
    }

    /// `POST path` starts a job of the node's (a backup, a verify); `GET path` until it is no
    /// longer `running` (at most `wait_sec`): its last status when `complete`, else its error
    /// as a failure.
    async fn run_to_end(
        &self,
        path: &str,
        request: Value,
        wait_sec: u64,
        what: &str,
    ) -> Result<Value, Failure> {
        let deadline = Instant::now() + Duration::from_secs(wait_sec);
        let started = self.call(Method::POST, path, Some(request)).await?;
        loop {
            tokio::time::sleep(JOB_POLL).await;
            let status = self.call(Method::GET, path, None).await?;
            if status["startedAtMs"] != started["startedAtMs"] || status["to"] != started["to"] {
                return Err(Failure::Fatal(format!(
                    "the node no longer reports {what} (restarted?)"
                )));
            }
            match status["state"].as_str() {
                Some("running") if Instant::now() < deadline => continue,
                Some("running") => {
                    return Err(Failure::Fatal(format!(
                        "{what} still runs after {wait_sec} s"
                    )))
                }
                Some("complete") => return Ok(status),
                _ => {
                    return Err(Failure::Fatal(format!(
                        "{what} failed: {}",
                        field(&status, "error")
                    )))
                }
            }
        }
    }

    /// `GET /admin/streams/<name>`: the name is the path, as on the protocol listener.
    async fn stream(&self, name: &str) -> Result<Value, Failure> {
        let path = format!("/admin/streams{}", stream_name(name));
        self.call(Method::GET, &path, None).await
    }

    /// Polls the stream until no transfer is pending and it sits on `to_node`.
    async fn wait_settled(&self, name: &str, to_node: i32) -> Result<(), Failure> {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            let body = self.stream(name).await?;
            if body["pendingTransfer"].is_null() && body["nodeId"].as_i64() == Some(to_node.into())
            {
                return Ok(());
            }
            if Instant::now() + WAIT_POLL > deadline {
                return Err(Failure::Fatal(format!(
                    "transfer of {name} did not settle in time"
                )));
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }
}

/// Puts a job's `--timeout-sec` and `--max-bytes-per-second` into its `request`; how long to
/// wait for it to end (its time limit, the node's default without one, and a margin).
fn job_bounds(
    request: &mut Value,
    timeout_sec: Option<u64>,
    max_bytes_per_second: Option<u64>,
    timeout_default_sec: u64,
) -> u64 {
    if let Some(timeout_sec) = timeout_sec {
        request["timeoutSec"] = json!(timeout_sec);
    }
    if let Some(rate) = max_bytes_per_second {
        request["maxBytesPerSecond"] = json!(rate);
    }
    timeout_sec
        .unwrap_or(timeout_default_sec)
        .saturating_add(BACKUP_ANSWER_MARGIN_SEC)
}

/// Stream names are paths; a missing leading `/` is added, as the stream commands do.
fn stream_name(name: &str) -> String {
    if name.starts_with('/') {
        name.to_owned()
    } else {
        format!("/{name}")
    }
}

impl Admin {
    /// No answer from the admin listener: the cause, and where the endpoint came from.
    fn transport(&self, e: reqwest::Error) -> Failure {
        let hint = if e.is_connect() {
            format!(
                "; is `pico serve` running with its admin listener at {}? (--admin-endpoint or \
                 PICO_ADMIN_ENDPOINT; `pico serve --admin-listen` sets where it listens, \
                 default {DEFAULT_ADMIN_ENDPOINT})",
                self.base
            )
        } else {
            String::new()
        };
        // pico-client digs the useful cause ("Connection refused") out of reqwest's chain.
        Failure::Fatal(format!(
            "admin request failed: {}{hint}",
            ClientError::from(e)
        ))
    }
}

/// The `error` of an admin error body, else the body as text, else the reason phrase.
fn error_text(status: reqwest::StatusCode, body: &[u8]) -> String {
    if let Ok(json) = serde_json::from_slice::<Value>(body) {
        if let Some(message) = json.get("error").and_then(Value::as_str) {
            return message.to_owned();
        }
    }
    let text = String::from_utf8_lossy(body).trim().to_owned();
    if !text.is_empty() {
        return text;
    }
    status.canonical_reason().unwrap_or("error").to_owned()
}

/// A field as printed in `key=value` lines: strings bare, `null` for null or absent.
fn field(body: &Value, name: &str) -> String {
    match body.get(name) {
        None | Some(Value::Null) => "null".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn print(json: bool, body: &Value, lines: fn(&Value) -> Vec<String>) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    if json {
        let pretty = serde_json::to_string_pretty(body).expect("a JSON value serializes");
        writeln!(out, "{pretty}")?;
    } else {
        for line in lines(body) {
            writeln!(out, "{line}")?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `segment=KEY&stream=ID`, the key percent-encoded.
fn entry_query(segment: &str, stream_id: u64) -> String {
    let key: String = segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("segment={key}&stream={stream_id}")
}

fn gc_hold_lines(b: &Value) -> Vec<String> {
    vec![format!(
        "held={} until={}",
        field(b, "held"),
        field(b, "untilMs")
    )]
}

fn backup_lines(b: &Value) -> Vec<String> {
    let f = |name| field(b, name);
    vec![
        format!(
            "backup={} cutAtMs={} checkpointedAtMs={} finishedAtMs={}",
            f("to"),
            f("startedAtMs"),
            f("checkpointedAtMs"),
            f("finishedAtMs")
        ),
        format!(
            "streams={} objects={} objectBytes={} subscriptions={}",
            f("streams"),
            f("objects"),
            f("objectBytes"),
            f("subscriptions")
        ),
    ]
}

fn verify_lines(b: &Value) -> Vec<String> {
    let f = |name| field(b, name);
    let mut lines = vec![format!(
        "objects={} bytes={} intact={} damaged={} unreadable={} collected={} startedAtMs={} finishedAtMs={}",
        f("objectsChecked"),
        f("bytesChecked"),
        f("intactObjects"),
        f("damagedObjects"),
        f("unreadableObjects"),
        f("collectedObjects"),
        f("startedAtMs"),
        f("finishedAtMs")
    )];
    for damaged in b["damaged"].as_array().into_iter().flatten() {
        let d = |name| field(damaged, name);
        lines.push(format!(
            "damaged object={} atByte={} cause={}",
            d("key"),
            d("atByte"),
            damaged["cause"]
        ));
        for lost in damaged["lost"].as_array().into_iter().flatten() {
            let l = |name| field(lost, name);
            lines.push(format!(
                "  lost stream={} from={} next={}",
                l("stream"),
                l("fromOffset"),
                l("nextOffset")
            ));
        }
    }
    for unreadable in b["unreadable"].as_array().into_iter().flatten() {
        lines.push(format!(
            "unreadable object={} error={}",
            field(unreadable, "key"),
            unreadable["error"]
        ));
    }
    lines
}

/// `pico admin restore`: local work, no node involved.
fn restore(json_output: bool, args: &AdminRestoreArgs) -> Result<(), Failure> {
    let target = pico_net::RestoreTarget {
        dir: args.to.clone(),
        storage: args.storage.clone(),
    };
    let summary =
        pico_net::restore(&args.from, &target).map_err(|e| Failure::Fatal(e.to_string()))?;
    let body = json!({
        "metaUrl": summary.meta_url,
        "storage": summary.storage,
        "walDir": summary.wal_dir.display().to_string(),
        "streams": summary.streams,
        "objects": summary.objects,
        "objectBytes": summary.object_bytes,
        "cutAtMs": summary.started_at_ms,
    });
    print(json_output, &body, |b| {
        vec![
            format!(
                "streams={} objects={} objectBytes={} cutAtMs={}",
                field(b, "streams"),
                field(b, "objects"),
                field(b, "objectBytes"),
                field(b, "cutAtMs")
            ),
            format!(
                "pico serve --meta-url {} --storage {} --wal-dir {}",
                field(b, "metaUrl"),
                field(b, "storage"),
                field(b, "walDir")
            ),
        ]
    })
}

fn quarantine_lines(body: &Value) -> Vec<String> {
    let entries = body["entries"].as_array().into_iter().flatten();
    entries
        .map(|e| {
            let offsets: Vec<String> = e["offsets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|range| format!("{}..{}", range[0], range[1]))
                .collect();
            format!(
                "segment={} stream={} offsets={} records={} reason={:?}",
                field(e, "segment"),
                field(e, "streamId"),
                offsets.join(","),
                field(e, "records"),
                field(e, "reason")
            )
        })
        .collect()
}

fn cluster_lines(c: &Value) -> Vec<String> {
    let f = |name| field(c, name);
    let mut lines = vec![
        format!(
            "cluster={} node={} epoch={} address={} registered={} appliedIndex={}",
            f("clusterId"),
            f("nodeId"),
            f("nodeEpoch"),
            f("advertisedAddress"),
            f("registered"),
            f("appliedIndex")
        ),
        format!(
            "streams={} objects={} destroyedBacklog={} leaseHolder={}",
            f("streamCount"),
            f("objectCount"),
            f("destroyedObjectBacklog"),
            f("leaseHolder")
        ),
    ];
    for t in c["pendingTransfers"].as_array().into_iter().flatten() {
        lines.push(format!(
            "transfer stream={} from={} to={}",
            field(t, "streamId"),
            field(t, "fromNode"),
            field(t, "toNode")
        ));
    }
    lines
}

fn nodes_lines(body: &Value) -> Vec<String> {
    let nodes = body["nodes"].as_array().into_iter().flatten();
    nodes
        .map(|n| {
            let f = |name| field(n, name);
            format!(
                "node={} epoch={} address={} slots={} opening={} placed={} state={} lease={}{}",
                f("nodeId"),
                f("nodeEpoch"),
                f("advertisedAddress"),
                f("slots"),
                f("openingCount"),
                f("placedCount"),
                f("state"),
                lease(&n["leaseExpiresInMs"]),
                if n["local"] == true {
                    " (this node)"
                } else {
                    ""
                }
            )
        })
        .collect()
}

/// `lease=`: `+4.2s` expires in 4.2 s, `-12.3s` lapsed 12.3 s ago, `-` none (a node that left,
/// or one without a cluster).
fn lease(expires_in_ms: &Value) -> String {
    match expires_in_ms.as_i64() {
        Some(ms) => format!("{:+.1}s", ms as f64 / 1000.0),
        None => "-".into(),
    }
}

fn stream_lines(s: &Value) -> Vec<String> {
    let f = |name| field(s, name);
    let mut lines = vec![
        format!(
            "name={} id={} owner={} address={} local={}",
            f("name"),
            f("streamId"),
            f("ownerNodeId"),
            f("ownerAdvertisedAddress"),
            f("ownerLocal")
        ),
        format!(
            "state={} epoch={} start={} end={} closed={} type={}",
            f("state"),
            f("epoch"),
            f("startOffset"),
            f("endOffset"),
            f("closed"),
            f("contentType")
        ),
    ];
    let pending = &s["pendingTransfer"];
    if !pending.is_null() {
        lines.push(format!(
            "transfer from={} to={}",
            field(pending, "fromNode"),
            field(pending, "toNode")
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_prints_two_lines_and_one_per_transfer() {
        let body = json!({
            "clusterId": "picomq", "nodeId": 1, "nodeEpoch": 7, "advertisedAddress": "http://h:1",
            "registered": true, "appliedIndex": 12, "streamCount": 3, "objectCount": 4,
            "destroyedObjectBacklog": 0, "leaseHolder": null,
            "pendingTransfers": [{"streamId": 9, "fromNode": 1, "toNode": 2}],
        });
        assert_eq!(
            cluster_lines(&body),
            [
                "cluster=picomq node=1 epoch=7 address=http://h:1 registered=true appliedIndex=12",
                "streams=3 objects=4 destroyedBacklog=0 leaseHolder=null",
                "transfer stream=9 from=1 to=2",
            ]
        );
    }

    #[test]
    fn nodes_mark_this_node_and_print_null_addresses() {
        let body = json!({"nodes": [
            {"nodeId": 1, "nodeEpoch": 5, "advertisedAddress": "http://a", "slots": 1,
             "local": true, "openingCount": 2, "placedCount": 0, "state": "live",
             "leaseExpiresInMs": 4210},
            {"nodeId": 2, "nodeEpoch": 6, "advertisedAddress": null, "slots": 0,
             "local": false, "openingCount": 0, "placedCount": 1, "state": "expired",
             "leaseExpiresInMs": -12_345},
            {"nodeId": 3, "nodeEpoch": 7, "advertisedAddress": "http://c", "slots": 1,
             "local": false, "openingCount": 0, "placedCount": 0, "state": "left",
             "leaseExpiresInMs": null},
        ]});
        assert_eq!(
            nodes_lines(&body),
            [
                "node=1 epoch=5 address=http://a slots=1 opening=2 placed=0 state=live \
                 lease=+4.2s (this node)",
                "node=2 epoch=6 address=null slots=0 opening=0 placed=1 state=expired \
                 lease=-12.3s",
                "node=3 epoch=7 address=http://c slots=1 opening=0 placed=0 state=left lease=-",
            ]
        );
    }

    #[test]
    fn a_pending_transfer_adds_a_line() {
        let mut body = json!({
            "name": "/s", "streamId": 3, "ownerNodeId": 1, "ownerAdvertisedAddress": "http://a",
            "ownerLocal": true, "state": "opened", "epoch": 1, "startOffset": 0, "endOffset": 5,
            "closed": false, "contentType": "text/plain", "pendingTransfer": null,
        });
        let lines = stream_lines(&body);
        assert_eq!(
            lines,
            [
                "name=/s id=3 owner=1 address=http://a local=true",
                "state=opened epoch=1 start=0 end=5 closed=false type=text/plain",
            ]
        );
        body["pendingTransfer"] = json!({"fromNode": 1, "toNode": 2});
        assert_eq!(stream_lines(&body)[2], "transfer from=1 to=2");
    }

    #[test]
    fn error_text_prefers_the_error_field() {
        let status = reqwest::StatusCode::NOT_FOUND;
        assert_eq!(
            error_text(status, br#"{"error":"stream /x not found"}"#),
            "stream /x not found"
        );
        assert_eq!(error_text(status, b"plain words\n"), "plain words");
        assert_eq!(error_text(status, b""), "Not Found");
    }
}
