//! The quarantine in the admin API (docs/durability.md, "Refused records"): records a segment
//! commit refused after they were acknowledged, kept until an operator releases them.
//!
//! - `GET /admin/quarantine`: every entry (segment, stream id and name, offsets, reason).
//! - `GET /admin/quarantine/records?segment=KEY&stream=ID`: its records, read from the
//!   segment object (`body` as text when it is UTF-8, else `bodyBase64`).
//! - `DELETE /admin/quarantine?segment=KEY&stream=ID`: release it; the garbage collector may
//!   then delete the segment.

use base64::Engine as _;
use pico_engine::frame::parse_headers;
use serde_json::{json, Map, Value};

use crate::admin::shared::{error, json_response, AdminState};
use crate::params::{query_param, strict_u64};
use crate::transport::message::Response;

pub(super) async fn list(state: &AdminState) -> Response {
    let entries = match state.core.meta().quarantined().await {
        Ok(Ok(entries)) => entries,
        Ok(Err(e)) => return error(503, e.to_string()),
        Err(_) => return error(503, "metadata store is shut down"),
    };
    let entries: Vec<Value> = entries
        .iter()
        .map(|entry| {
            let offsets: Vec<Value> = entry
                .runs
                .iter()
                .map(|run| json!([run.first_offset, run.next_offset]))
                .collect();
            json!({
                "segment": entry.segment_key,
                "streamId": entry.stream_id,
                "offsets": offsets,
                "records": entry.runs.iter().map(|r| r.next_offset - r.first_offset).sum::<u64>(),
                "reason": entry.reason,
                "createdMs": entry.created_ms,
            })
        })
        .collect();
    json_response(200, json!({ "entries": entries }))
}

/// The entry named by the query's `segment` and `stream`, or the answer to give instead.
async fn find(state: &AdminState, query: &str) -> Result<pico_engine::meta::Quarantined, Response> {
    let (Some(segment), Some(stream)) =
        (query_param(query, "segment"), query_param(query, "stream"))
    else {
        return Err(error(400, "segment=KEY and stream=ID are required"));
    };
    let Some(stream_id) = strict_u64(&stream) else {
        return Err(error(400, format!("invalid stream id {stream:?}")));
    };
    let entries = match state.core.meta().quarantined().await {
        Ok(Ok(entries)) => entries,
        Ok(Err(e)) => return Err(error(503, e.to_string())),
        Err(_) => return Err(error(503, "metadata store is shut down")),
    };
    entries
        .into_iter()
        .find(|e| e.segment_key == segment && e.stream_id == stream_id)
        .ok_or_else(|| {
            error(
                404,
                format!("nothing quarantined of stream {stream_id} in {segment}"),
            )
        })
}

pub(super) async fn records(state: &AdminState, query: &str) -> Response {
    let entry = match find(state, query).await {
        Ok(entry) => entry,
        Err(response) => return response,
    };
    let records = match pico_engine::quarantine::export(state.core.store(), &entry).await {
        Ok(records) => records,
        Err(e) => return error(502, e.to_string()),
    };
    let records: Vec<Value> = records
        .iter()
        .map(|record| {
            let mut headers = Map::new();
            for (name, value) in parse_headers(&record.headers) {
                headers.insert(
                    String::from_utf8_lossy(&name).into_owned(),
                    Value::String(String::from_utf8_lossy(&value).into_owned()),
                );
            }
            let mut out = json!({
                "offset": record.offset,
                "timestampMs": record.timestamp_ms,
                "headers": headers,
            });
            match std::str::from_utf8(&record.body) {
                Ok(text) => out["body"] = json!(text),
                Err(_) => {
                    let encoded = base64::engine::general_purpose::STANDARD.encode(&record.body);
                    out["bodyBase64"] = json!(encoded);
                }
            }
            out
        })
        .collect();
    json_response(
        200,
        json!({ "segment": entry.segment_key, "streamId": entry.stream_id, "records": records }),
    )
}

pub(super) async fn release(state: &AdminState, query: &str) -> Response {
    let entry = match find(state, query).await {
        Ok(entry) => entry,
        Err(response) => return response,
    };
    match state
        .core
        .meta()
        .release_quarantined(&entry.segment_key, entry.stream_id)
        .await
    {
        Ok(Ok(_)) => json_response(
            200,
            json!({ "released": true, "segment": entry.segment_key, "streamId": entry.stream_id }),
        ),
        Ok(Err(e)) => error(503, e.to_string()),
        Err(_) => error(503, "metadata store is shut down"),
    }
}
