//! The admin API of a cluster node (a node on a shared Postgres metadata log): answers
//! about every node and every stream, from this node's view of the cluster (the nodes, as of
//! its last lease renewal) and the metadata log (owners, transfers). The single-node answers
//! are in `mod.rs`. The cluster tables (owners, pending transfers, slots) are read and
//! written here straight from the metadata log: they are the operator's view of the cluster,
//! not a stream operation, so no engine core serves them (net/Cargo.toml says so too).

use std::sync::Arc;

use pico_engine::{Cluster, EngineError, StreamInfo};
use pico_meta::{MetaError, NodeId, NodeRow, Ownership};
use serde_json::{json, Value};

use crate::admin::shared::{error, json_response, retention_json, AdminState};
use crate::time::format_rfc3339_ms;
use crate::transport::message::Response;

async fn wait<T>(reply: pico_meta::Reply<T>) -> Result<T, MetaError> {
    reply.await.unwrap_or(Err(MetaError::Closed))
}

fn meta_error(e: MetaError) -> Response {
    match e {
        MetaError::NotFound(m) => error(404, m),
        MetaError::Rejected(m) => error(400, m),
        MetaError::Fenced(m) => error(409, m),
        other => error(500, other.to_string()),
    }
}

/// `registered`: this incarnation is in the view with an address.
pub fn registered(cluster: &Cluster) -> bool {
    cluster.view().nodes.iter().any(|n| {
        n.id == cluster.node_id() && n.epoch == cluster.config.node_epoch && !n.address.is_empty()
    })
}

/// A node's liveness by its lease (`now_ms`: the database clock the lease is kept on):
/// `live` holds an unexpired lease; `left` released it on a clean stop (its streams were handed
/// over at once); `expired` stopped renewing it, killed or cut off (its streams were taken over
/// once it lapsed).
fn node_state(node: &NodeRow, now_ms: i64) -> &'static str {
    if node.lease_expires_ms == 0 {
        "left"
    } else if node.is_live(now_ms) {
        "live"
    } else {
        "expired"
    }
}

/// A node as this node's view has it (`view_now_ms`: the database clock of that view), its
/// lease as the database has it now (`lease`: its row and the clock of a fresh read; the view's
/// when the database did not answer). `live` is the view's, what this node routes by; `state`
/// and the lease times are current.
fn node_json(
    cluster: &Cluster,
    node: &NodeRow,
    view_now_ms: i64,
    lease: (&NodeRow, i64),
    owned: u64,
) -> Value {
    let (current, now_ms) = lease;
    let state = node_state(current, now_ms);
    json!({
        "nodeId": node.id,
        "nodeEpoch": node.epoch,
        "advertisedAddress": if node.address.is_empty() { Value::Null } else { json!(node.address) },
        "dsAddress": if node.ds_address.is_empty() { Value::Null } else { json!(node.ds_address) },
        "slots": node.slots,
        "local": node.id == cluster.node_id(),
        "state": state,
        "live": node.is_live(view_now_ms),
        "leaseExpiresAtMs": current.lease_expires_ms,
        // Negative: lapsed that long ago.
        "leaseExpiresInMs": match state {
            "left" => Value::Null,
            _ => json!(current.lease_expires_ms.saturating_sub(now_ms)),
        },
        "registeredAtMs": node.registered_ms,
        "openingCount": owned,
        "placedCount": 0,
    })
}

/// Streams owned by `node` in `counts`.
fn owned_by(counts: &[(Option<NodeId>, u64)], node: NodeId) -> u64 {
    counts
        .iter()
        .find(|(n, _)| *n == Some(node))
        .map_or(0, |(_, c)| *c)
}

async fn owner_counts(state: &AdminState) -> Result<Vec<(Option<NodeId>, u64)>, Response> {
    wait(state.core.meta().owner_counts())
        .await
        .map_err(meta_error)
}

pub async fn nodes(state: &AdminState, cluster: &Arc<Cluster>) -> Response {
    let counts = match owner_counts(state).await {
        Ok(counts) => counts,
        Err(response) => return response,
    };
    let view = cluster.view();
    // The leases read now, not as of the view's lease round (a third of a lease ago at most).
    let fresh = wait(state.core.meta().cluster_state(cluster.node_id()))
        .await
        .ok();
    let nodes: Vec<Value> = view
        .nodes
        .iter()
        .map(|n| {
            let lease = fresh
                .as_ref()
                .and_then(|f| f.nodes.iter().find(|r| r.id == n.id).map(|r| (r, f.now_ms)))
                .unwrap_or((n, view.now_ms));
            node_json(cluster, n, view.now_ms, lease, owned_by(&counts, n.id))
        })
        .collect();
    json_response(200, json!({ "nodes": nodes }))
}

pub async fn summary(state: &AdminState, cluster: &Arc<Cluster>) -> Value {
    let streams: u64 = owner_counts(state)
        .await
        .map(|counts| counts.iter().map(|(_, c)| c).sum())
        .unwrap_or(0);
    let transfers: Vec<Value> = wait(state.core.meta().pending_transfers())
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|(id, from, to)| json!({"streamId": id, "fromNode": from, "toNode": to}))
        .collect();
    let view = cluster.view();
    let live_nodes = view.nodes.iter().filter(|n| n.is_live(view.now_ms)).count();
    let (address, ds_address) = cluster.addresses();
    json!({
        "clusterId": cluster.config.cluster_id,
        "nodeId": cluster.node_id(),
        "nodeEpoch": cluster.config.node_epoch,
        "advertisedAddress": address,
        "dsAddress": ds_address,
        "registered": registered(cluster),
        "streamCount": streams,
        "pendingTransfers": transfers,
        "leaseHolder": cluster.lease_valid(),
        "routing": if cluster.config.redirect { "redirect" } else { "local" },
        "liveNodes": live_nodes,
    })
}

/// `GET /admin/streams/{name}`: the owner from the metadata log; the live offsets from the
/// engine when this node serves the stream, the committed trim point otherwise.
pub async fn stream(state: &AdminState, cluster: &Arc<Cluster>, name: &str) -> Response {
    let found = match wait(state.core.meta().lookup_stream(name)).await {
        Ok(found) => found,
        Err(e) => return meta_error(e),
    };
    let Some((row, ownership)) = found else {
        return error(404, format!("stream {name} not found"));
    };
    let local: Option<StreamInfo> = if ownership.node == Some(cluster.node_id()) {
        match state.core.head(name).await {
            Ok(info) => Some(info),
            Err(EngineError::NotFound) => return error(404, format!("stream {name} not found")),
            Err(_) => None,
        }
    } else {
        None
    };
    json_response(
        200,
        stream_json(cluster, name, &row, ownership, local.as_ref()),
    )
}

fn stream_json(
    cluster: &Cluster,
    name: &str,
    row: &pico_meta::StreamRow,
    ownership: Ownership,
    local: Option<&StreamInfo>,
) -> Value {
    let owner_address = ownership.node.and_then(|n| {
        cluster
            .view()
            .nodes
            .iter()
            .find(|r| r.id == n)
            .map(|r| r.address.clone())
    });
    let closed = local.map_or(row.closed, |i| i.closed);
    json!({
        "name": name,
        "streamId": row.id,
        "ownerNodeId": ownership.node,
        "ownerAdvertisedAddress": owner_address,
        "ownerLocal": ownership.node == Some(cluster.node_id()),
        "contentType": row.config.content_type,
        "ttlSeconds": row.config.ttl_sec,
        "expiresAtMs": row.config.expires_at_ms,
        "expiresAt": row.config.expires_at_ms.map(format_rfc3339_ms),
        "closed": closed,
        "state": if closed { "closed" } else { "opened" },
        "epoch": ownership.epoch,
        "nodeId": ownership.node,
        "startOffset": local.map_or(row.start_offset, |i| i.start_offset),
        "endOffset": local.map(|i| i.next_offset),
        "pendingTransfer": match (ownership.transfer_to, ownership.node) {
            (Some(to), from) => json!({"fromNode": from, "toNode": to}),
            _ => Value::Null,
        },
        "retention": retention_json(&local.map_or(row.config.retention, |i| i.retention)),
    })
}

/// `POST /admin/transfer` in a cluster: recorded in the metadata log; the owner hands the
/// stream over on its next lease round.
pub async fn transfer(state: &AdminState, name: &str, to_node: u64) -> Response {
    let Ok(to_node) = NodeId::try_from(to_node) else {
        return error(400, format!("node {to_node} is not registered"));
    };
    match wait(state.core.meta().request_transfer(name, to_node)).await {
        Ok(accepted) => json_response(
            202,
            json!({
                "stream": name,
                "streamId": accepted.stream_id,
                "fromNode": accepted.from_node,
                "toNode": accepted.to_node,
                "pending": true,
            }),
        ),
        Err(e) => meta_error(e),
    }
}

/// `POST /admin/nodes/{id}` in a cluster: the node's placement weight.
pub async fn set_slots(
    state: &AdminState,
    cluster: &Arc<Cluster>,
    id: &str,
    slots: u64,
) -> Response {
    let Ok(node) = id.parse::<NodeId>() else {
        return error(404, format!("node {id} is not registered"));
    };
    match wait(state.core.meta().set_slots(node, slots)).await {
        Ok(row) => {
            let counts = owner_counts(state).await.unwrap_or_default();
            let view = cluster.view();
            let owned = owned_by(&counts, row.id);
            let lease = (&row, view.now_ms);
            json_response(200, node_json(cluster, &row, view.now_ms, lease, owned))
        }
        Err(e) => meta_error(e),
    }
}
