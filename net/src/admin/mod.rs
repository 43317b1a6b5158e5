//! The admin listener: probes, the admin API, Prometheus metrics and the dashboard.
//!
//! Runs on core 0. Admin reads come from the engine's in-memory state (stream heads and
//! listings through core 0's handle) and the per-core counters; nothing here touches SQL.
//! Errors are `{"error":"<message>"}`. With `--auth required`, everything but `/health` and
//! `/ready` needs a token with the `admin` grant.

pub mod backup;
pub mod cluster;
mod consumers;
pub mod dashboard;
pub mod gc_hold;
pub mod metrics;
mod quarantine;
pub mod shared;
pub mod usage;
pub mod verify;

use std::rc::Rc;
use std::sync::atomic::Ordering;

use pico_engine::health::HealthState;
use pico_engine::{EngineError, StreamInfo};
use serde_json::{json, Value};

use crate::auth::{bearer, Denied, Permission};
use crate::time::format_rfc3339_ms;
use crate::transport::message::{Request, Response};
use metrics::CoreLoad;

/// This build runs one node; the cluster work gives nodes their own ids.
const NODE_ID: u64 = 1;

use crate::admin::shared::{error, json_response, retention_json};
pub use crate::admin::shared::{AdminState, NodeFacts};
use crate::limits::{ADMIN_STREAMS_PAGE_DEFAULT, ADMIN_STREAMS_PAGE_MAX};

pub async fn handle(state: &Rc<AdminState>, request: Request) -> Response {
    let method = request.method.as_str();
    let path = request.path.as_str();
    match (method, path) {
        ("GET" | "HEAD", "/health") => {
            return Response::new(200)
                .header("content-type", "text/plain")
                .header("cache-control", "no-store")
                .with_body("ok")
        }
        ("GET" | "HEAD", "/ready") => {
            let serving = state.serving.load(Ordering::Relaxed);
            let (registered, node_id) = match state.core.cluster() {
                Some(cluster) => (
                    crate::admin::cluster::registered(cluster) && cluster.lease_valid(),
                    u64::from(cluster.node_id()),
                ),
                None => (true, NODE_ID),
            };
            // A core whose WAL failed takes no appends until a restart: not ready, so a
            // supervisor restarts it. One that cannot make its next WAL file (a full disk)
            // still serves reads and resumes by itself: ready, and says it is degraded.
            let mut storage = Vec::new();
            let mut failed = false;
            for (core, metrics) in state.engine_metrics.iter().enumerate() {
                let health = metrics.wal_health.state();
                if health != HealthState::Ok {
                    failed |= health == HealthState::Failed;
                    storage.push(json!({
                        "core": core,
                        "state": health.name(),
                        "reason": metrics.wal_health.reason(),
                    }));
                }
            }
            let ready = serving && registered && !failed;
            let mut body = json!({
                "ready": ready,
                "serving": serving,
                "registered": registered,
                "appliedIndex": 0,
                "nodeId": node_id,
            });
            if !storage.is_empty() {
                body["degraded"] = json!(true);
                body["storage"] = json!(storage);
            }
            // Ready (the operator chose to start), but never quiet about what was lost.
            if !state.facts.wal_salvaged.is_empty() {
                body["degraded"] = json!(true);
                body["walSalvaged"] = json!(state.facts.wal_salvaged);
            }
            // Served from memory until the bucket takes them; nothing newer is stored before.
            let unstored = state.facts.recovery_backlog.unstored_segments();
            if unstored > 0 {
                body["degraded"] = json!(true);
                body["recoveredUnstored"] = json!(unstored);
            }
            return json_response(if ready { 200 } else { 503 }, body);
        }
        _ => {}
    }
    if let Some(tokens) = &state.tokens {
        // The dashboard page itself is public; the data it polls is not.
        let page = method == "GET" && dashboard::asset(path).is_some();
        if !page {
            match tokens.check(
                bearer(request.header("authorization")),
                Permission::Admin,
                "/",
            ) {
                Ok(()) => {}
                Err(Denied::Unauthenticated) => {
                    return error(401, "a valid bearer token is required")
                        .header("www-authenticate", "Bearer")
                }
                Err(Denied::Forbidden) => return error(403, "an admin token is required"),
            }
        }
    }
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let mut body = metrics::render(
                state.facts.build,
                &state.engine_metrics,
                state.facts.wal_salvaged.len(),
                state.facts.recovery_backlog.unstored_segments(),
                &state.http_metrics,
                &state.usage.get(),
                state.started.elapsed().as_secs_f64(),
            );
            body.push_str(&consumers::metrics_text(state).await);
            body.push_str(&state.verify.metrics_text());
            Response::new(200)
                .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                .header("cache-control", "no-store")
                .with_body(body)
        }
        ("GET", "/admin/consumers") => consumers::list(state).await,
        ("GET", "/admin/cluster") => cluster(state).await,
        ("GET", "/admin/nodes") => match state.core.cluster() {
            Some(cluster) => crate::admin::cluster::nodes(state, cluster).await,
            None => json_response(200, json!({ "nodes": [node_json(state)] })),
        },
        ("GET", "/admin/stats") => json_response(200, stats(state)),
        ("GET", "/admin/streams") => streams(state, &request.query).await,
        ("GET", p) if p.starts_with("/admin/streams/") => {
            stream(state, &p["/admin/streams".len()..]).await
        }
        ("POST", "/admin/transfer") => transfer(state, &request).await,
        ("POST", "/admin/backup") => backup::backup(state, &request).await,
        ("GET", "/admin/backup") => backup::status(state),
        ("POST", "/admin/verify") => verify::verify(state, &request),
        ("GET", "/admin/verify") => verify::status(state),
        ("POST", "/admin/checkpoint") => gc_hold::checkpoint(state, &request).await,
        ("GET", "/admin/gc-hold") => gc_hold::status(state),
        ("POST", "/admin/gc-hold") => gc_hold::hold(state, &request).await,
        ("DELETE", "/admin/gc-hold") => gc_hold::release(state),
        ("GET", "/admin/quarantine") => quarantine::list(state).await,
        ("GET", "/admin/quarantine/records") => quarantine::records(state, &request.query).await,
        ("DELETE", "/admin/quarantine") => quarantine::release(state, &request.query).await,
        ("POST", p) if p.starts_with("/admin/nodes/") => set_slots(state, &request).await,
        ("GET" | "HEAD", p) if allowed_methods(p).is_none() => match dashboard::asset(p) {
            Some((content_type, body, cache)) => Response::new(200)
                .header("content-type", content_type)
                .header("cache-control", cache)
                .header("x-content-type-options", "nosniff")
                .with_body(body),
            None => error(404, format!("no such path {p}")),
        },
        // RFC 9110: a 405 lists the methods the resource supports.
        (_, p) => error(405, "method not allowed")
            .header("allow", allowed_methods(p).unwrap_or("GET, HEAD")),
    }
}

/// The methods the admin API serves at `path` (the `Allow` of its 405s); `None` for every
/// other path, where the dashboard's `GET` and `HEAD` look for an asset.
fn allowed_methods(path: &str) -> Option<&'static str> {
    Some(match path {
        "/health" | "/ready" | "/metrics" => "GET, HEAD",
        "/admin/transfer" | "/admin/checkpoint" => "POST",
        "/admin/backup" | "/admin/verify" => "GET, POST",
        "/admin/gc-hold" => "GET, POST, DELETE",
        "/admin/quarantine" => "GET, DELETE",
        p if p.starts_with("/admin/nodes/") => "POST",
        "/admin/cluster"
        | "/admin/nodes"
        | "/admin/stats"
        | "/admin/consumers"
        | "/admin/streams"
        | "/admin/quarantine/records" => "GET",
        p if p.starts_with("/admin/streams/") => "GET",
        _ => return None,
    })
}

fn node_json(state: &AdminState) -> Value {
    let streams = stream_count(state);
    json!({
        "nodeId": NODE_ID,
        "nodeEpoch": state.facts.node_epoch_ms,
        "advertisedAddress": state.facts.advertised_address,
        "slots": state.slots.get(),
        "local": true,
        // A node without a cluster holds no lease: answering, it is live.
        "state": "live",
        "live": true,
        "openingCount": streams,
        "placedCount": 0,
        "cores": state.facts.cores,
    })
}

/// Streams on every core, from the per-core gauges (kept exact on create and delete): a
/// count, not a listing of a million names per dashboard poll.
fn stream_count(state: &AdminState) -> u64 {
    state
        .engine_metrics
        .iter()
        .map(|m| pico_engine::metrics::CoreMetrics::get(&m.streams))
        .sum()
}

async fn cluster(state: &AdminState) -> Response {
    let objects: u64 = state
        .engine_metrics
        .iter()
        .map(|m| pico_engine::metrics::CoreMetrics::get(&m.segments))
        .sum();
    let mut body = json!({
            "clusterId": "local",
            "nodeId": NODE_ID,
            "nodeEpoch": state.facts.node_epoch_ms,
            "advertisedAddress": state.facts.advertised_address,
            "registered": true,
            "appliedIndex": 0,
            "streamCount": stream_count(state),
            "objectCount": objects,
            "destroyedObjectBacklog": 0,
            "pendingTransfers": [],
            "leaseHolder": Value::Null,
            "ready": state.serving.load(Ordering::Relaxed),
            "durability": state.facts.durability,
            "storage": state.facts.storage,
            "metaUrl": state.facts.meta_url,
            "cores": state.facts.cores,
            "uptimeMs": state.started.elapsed().as_millis() as u64,
            "version": state.facts.build.version,
            "commit": state.facts.build.commit,
    });
    if let Some(cluster) = state.core.cluster() {
        // The cluster's answers replace the single node's.
        let summary = crate::admin::cluster::summary(state, cluster).await;
        if let (Some(body), Value::Object(fields)) = (body.as_object_mut(), summary) {
            body.extend(fields);
        }
    }
    json_response(200, body)
}

fn load_json(load: &CoreLoad) -> Value {
    json!({
        "appends": load.appends,
        "recordsAppended": load.records_appended,
        "bytesAppended": load.bytes_appended,
        "reads": load.reads,
        "bytesRead": load.bytes_read,
        "streams": load.streams,
        "uploadBacklogBytes": load.upload_backlog_bytes,
        "memoryBytes": load.memory_bytes,
        "connections": load.connections,
        "liveWaiters": load.live_waiters,
    })
}

/// Counters per core and in total, for the dashboard's rates (it differentiates polls).
fn stats(state: &AdminState) -> Value {
    let loads: Vec<CoreLoad> = state
        .engine_metrics
        .iter()
        .zip(&state.http_metrics)
        .map(|(engine, http)| metrics::core_load(engine, http))
        .collect();
    let mut total = CoreLoad::default();
    for load in &loads {
        total.appends += load.appends;
        total.records_appended += load.records_appended;
        total.bytes_appended += load.bytes_appended;
        total.reads += load.reads;
        total.bytes_read += load.bytes_read;
        total.streams += load.streams;
        total.upload_backlog_bytes += load.upload_backlog_bytes;
        total.memory_bytes += load.memory_bytes;
        total.connections += load.connections;
        total.live_waiters += load.live_waiters;
    }
    json!({
        "uptimeMs": state.started.elapsed().as_millis() as u64,
        "nowMs": pico_engine::now_ms(),
        "latency": latency_json(state),
        "responses": responses_json(&metrics::ResponseCounts::of(&state.http_metrics)),
        "storage": storage_json(&state.usage.get()),
        "cores": loads.iter().enumerate().map(|(core, load)| {
            let mut value = load_json(load);
            value["core"] = json!(core);
            value
        }).collect::<Vec<_>>(),
        "total": load_json(&total),
    })
}

/// The append and WAL fsync latency histograms of every core, added up: cumulative bucket
/// counts under `boundsUs` (the last bucket is everything above), for the dashboard to take
/// percentiles of the samples between two polls.
fn latency_json(state: &AdminState) -> Value {
    use pico_engine::metrics::{OpKind, LATENCY_BUCKETS_US};
    let histogram = |(buckets, sum_us, count): (Vec<u64>, u64, u64)| json!({ "buckets": buckets, "sumUs": sum_us, "count": count });
    let cores = || state.engine_metrics.iter();
    json!({
        "boundsUs": LATENCY_BUCKETS_US,
        "append": histogram(metrics::merged_histogram(
            cores().map(|m| &m.op(OpKind::Append).latency)
        )),
        "fsync": histogram(metrics::merged_histogram(cores().map(|m| &m.wal_fsync_latency))),
    })
}

/// Protocol answers since the start: all, the node's errors, the clients' errors and the
/// refusals by code (`metrics::REFUSAL_CODES`).
fn responses_json(counts: &metrics::ResponseCounts) -> Value {
    let refused: serde_json::Map<String, Value> = counts
        .refusals()
        .into_iter()
        .map(|(code, n)| (code.to_string(), json!(n)))
        .collect();
    json!({
        "total": counts.total(),
        "serverErrors": counts.server_errors(),
        "clientErrors": counts.client_errors(),
        "refused": refused,
    })
}

/// The last storage measurement; `null` for what was not measured.
fn storage_json(usage: &usage::StorageUsage) -> Value {
    json!({
        "walBytes": usage.wal_bytes,
        "metaBytes": usage.meta_bytes,
        "bucketBytes": usage.bucket.map(|b| b.bytes),
        "bucketSegments": usage.bucket.map(|b| b.segments),
        "measuredAtMs": usage.measured_at_ms,
    })
}

fn stream_json(name: &str, info: &StreamInfo, state: &AdminState) -> Value {
    json!({
        "name": name,
        "streamId": info.id,
        "ownerNodeId": NODE_ID,
        "ownerAdvertisedAddress": state.facts.advertised_address,
        "ownerLocal": true,
        "contentType": info.content_type,
        "ttlSeconds": info.ttl_sec,
        "expiresAtMs": info.expires_at_ms,
        "expiresAt": info.expires_at_ms.map(format_rfc3339_ms),
        "closed": info.closed,
        "state": if info.closed { "closed" } else { "opened" },
        "epoch": 1,
        "nodeId": NODE_ID,
        "startOffset": info.start_offset,
        "endOffset": info.next_offset,
        "pendingTransfer": Value::Null,
        "retention": retention_json(&info.retention),
    })
}

async fn streams(state: &AdminState, query: &str) -> Response {
    let prefix = crate::params::query_param(query, "prefix").unwrap_or_default();
    let prefix = if prefix.is_empty() {
        "/".to_string()
    } else {
        prefix
    };
    let after = crate::params::query_param(query, "after").unwrap_or_default();
    let limit = match crate::params::query_param(query, "limit") {
        None => ADMIN_STREAMS_PAGE_DEFAULT,
        Some(text) => match crate::params::strict_u64(&text) {
            Some(0) => ADMIN_STREAMS_PAGE_DEFAULT,
            Some(n) => (n as usize).min(ADMIN_STREAMS_PAGE_MAX),
            None => return error(400, format!("invalid limit {text:?}")),
        },
    };
    match state.core.list(&prefix, &after, limit).await {
        Ok((page, more)) => {
            let streams: Vec<Value> = page
                .iter()
                .map(|s| stream_json(&s.name, &s.info, state))
                .collect();
            json_response(200, json!({ "streams": streams, "hasMore": more }))
        }
        Err(e) => error(500, e.to_string()),
    }
}

async fn stream(state: &AdminState, name: &str) -> Response {
    if let Some(cluster) = state.core.cluster() {
        return crate::admin::cluster::stream(state, cluster, name).await;
    }
    match state.core.head(name).await {
        Ok(info) => json_response(200, stream_json(name, &info, state)),
        Err(EngineError::NotFound | EngineError::Gone) => {
            error(404, format!("stream {name} not found"))
        }
        Err(e) => error(500, e.to_string()),
    }
}

fn body_json(request: &Request) -> Result<Value, Response> {
    serde_json::from_slice(&request.body).map_err(|e| error(400, format!("invalid JSON body: {e}")))
}

/// The non-negative integer `key` of a JSON body. `2.0` is one (an integer to JSON Schema, and
/// so to the OpenAPI description and the clients generated from it); `2.5`, `-1` and `"2"` are
/// not (400 saying so), and an absent key is `missing "key"`.
fn body_u64(body: &Value, key: &str) -> Result<u64, Response> {
    /// Above 2^53 a float no longer holds every integer.
    const EXACT_MAX: f64 = 9_007_199_254_740_992.0;
    let value = match body.get(key) {
        None | Some(Value::Null) => return Err(error(400, format!("missing \"{key}\""))),
        Some(value) => value,
    };
    value
        .as_u64()
        .or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..=EXACT_MAX).contains(f))
                .map(|f| f as u64)
        })
        .ok_or_else(|| error(400, format!("\"{key}\" must be a non-negative integer")))
}

/// `{"stream","toNode"}`: a single node owns every stream, so the only valid target is itself,
/// which the transfer rules refuse ("target equals source").
async fn transfer(state: &AdminState, request: &Request) -> Response {
    let body = match body_json(request) {
        Ok(body) => body,
        Err(response) => return response,
    };
    let Some(name) = body.get("stream").and_then(Value::as_str) else {
        return error(400, "missing \"stream\"");
    };
    let to_node = match body_u64(&body, "toNode") {
        Ok(to_node) => to_node,
        Err(response) => return response,
    };
    if state.core.cluster().is_some() {
        return crate::admin::cluster::transfer(state, name, to_node).await;
    }
    match state.core.head(name).await {
        Ok(_) => {}
        Err(EngineError::NotFound | EngineError::Gone) => {
            return error(404, format!("stream {name} not found"))
        }
        Err(e) => return error(500, e.to_string()),
    }
    if to_node != NODE_ID {
        return error(400, format!("node {to_node} is not registered"));
    }
    error(
        400,
        format!("stream {name} is already on node {to_node} (target equals source)"),
    )
}

/// `POST /admin/nodes/{id}` with `{"slots": n}`.
async fn set_slots(state: &AdminState, request: &Request) -> Response {
    let id = &request.path["/admin/nodes/".len()..];
    let body = match body_json(request) {
        Ok(body) => body,
        Err(response) => return response,
    };
    let slots = match body_u64(&body, "slots") {
        Ok(slots) => slots,
        Err(response) => return response,
    };
    if let Some(cluster) = state.core.cluster() {
        return crate::admin::cluster::set_slots(state, cluster, id, slots).await;
    }
    if id.parse::<u64>().ok() != Some(NODE_ID) {
        return error(404, format!("node {id} is not registered"));
    }
    state.slots.set(slots);
    json_response(200, node_json(state))
}

pub fn connection_error(status: u16, message: &str) -> Response {
    error(status, message)
}
