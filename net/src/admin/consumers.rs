//! Named consumers for operators: `GET /admin/consumers` (every consumer with its state,
//! members and, per stream, where it stands, the stream's tail and the lag between them) and
//! the lag gauges of `/metrics`. Both read the metadata log's consumer documents and the
//! tails of the streams this node serves; a stream another node serves shows no tail here
//! (its node reports it).

use pico_meta::MetaError;
use serde_json::{json, Value};

use crate::admin::shared::{error, json_response, AdminState};
use std::collections::HashMap;

use crate::consumers::rules::outline;
use crate::transport::message::Response;

/// Consumers one answer or one scrape reports at most (ordered by scope and id): the
/// metadata log holds up to `CONSUMERS_PER_SCOPE_MAX` per scope, more than a scrape should
/// carry.
pub const CONSUMERS_REPORTED_MAX: usize = 1_000;
/// Streams of consumers (lag series) one answer or scrape reports at most: a consumer follows
/// up to 256 streams, so 1,000 consumers could be 256,000 series of long names.
pub const CONSUMER_STREAMS_REPORTED_MAX: usize = 10_000;
/// Consumer documents read for one answer or scrape, in bytes at most: a document of 256 long
/// stream names is hundreds of KiB, and a report holds every one it read until it is sent.
pub const CONSUMER_DOCUMENT_BYTES_REPORTED_MAX: usize = 16 << 20;
/// Consumers read from the metadata log at a time.
const CONSUMERS_PAGE: u32 = 32;

/// One stream of one consumer, with the lag where the tail is known here.
struct Row {
    scope: String,
    id: String,
    group: bool,
    stream: String,
    next_seq: u64,
    tail: Option<u64>,
}

/// What a report holds: its rows, how many consumers there are, and whether some consumers or
/// streams were left out (past a bound above).
struct Rows {
    rows: Vec<Row>,
    total: u64,
    truncated: bool,
}

async fn rows(state: &AdminState) -> Result<Rows, MetaError> {
    let meta = state.core.meta();
    let mut rows = Vec::new();
    let (mut consumers, mut document_bytes) = (0usize, 0usize);
    let (mut total, mut truncated): (u64, bool);
    let mut after: Option<(String, String)> = None;
    // Consumers often share streams: each stream's tail and incarnation (stream id) are asked
    // once per answer.
    let mut tails: HashMap<String, Option<(u64, u64)>> = HashMap::new();
    'pages: loop {
        truncated = true;
        let (page, all) = meta
            .consumer_page(after.clone(), CONSUMERS_PAGE)
            .await
            .unwrap_or(Err(MetaError::Closed))?;
        total = all;
        let Some(last) = page.last() else {
            truncated = false;
            break;
        };
        after = Some((last.scope.clone(), last.id.clone()));
        for consumer in page {
            let bounded = consumers >= CONSUMERS_REPORTED_MAX
                || document_bytes >= CONSUMER_DOCUMENT_BYTES_REPORTED_MAX;
            if bounded {
                break 'pages;
            }
            consumers += 1;
            document_bytes = document_bytes.saturating_add(consumer.document.len());
            let (group, streams) = outline(&consumer.document).unwrap_or_default();
            for cursor in streams {
                if rows.len() >= CONSUMER_STREAMS_REPORTED_MAX {
                    break 'pages;
                }
                let live = match tails.get(&cursor.path) {
                    Some(live) => *live,
                    None => {
                        let live = state
                            .core
                            .head(&cursor.path)
                            .await
                            .ok()
                            .map(|info| (info.next_offset, info.id));
                        tails.insert(cursor.path.clone(), live);
                        live
                    }
                };
                // As the consumer's next change will place it in the live stream.
                let next = match live {
                    Some((_, id)) => cursor.next_in(id),
                    None => cursor.next,
                };
                rows.push(Row {
                    scope: consumer.scope.clone(),
                    id: consumer.id.clone(),
                    group,
                    stream: cursor.path,
                    next_seq: next.map_or(0, |(seq, _)| seq),
                    tail: live.map(|(tail, _)| tail),
                });
            }
        }
    }
    Ok(Rows {
        // Cut by a bound, or consumers registered while the pages were read.
        truncated: truncated || (consumers as u64) < total,
        rows,
        total,
    })
}

/// `GET /admin/consumers`.
pub async fn list(state: &AdminState) -> Response {
    let Rows {
        rows,
        total,
        truncated,
    } = match rows(state).await {
        Ok(found) => found,
        Err(e) => return error(503, format!("consumers: {e}")),
    };
    let mut consumers: Vec<Value> = Vec::new();
    for row in rows {
        let stream = json!({
            "stream": row.stream,
            "next_seq": row.next_seq,
            "tail": row.tail,
            "lag": row.tail.map(|t| t.saturating_sub(row.next_seq)),
        });
        let same = consumers
            .last()
            .is_some_and(|c| c["scope"] == row.scope.as_str() && c["consumer"] == row.id.as_str());
        if same {
            if let Some(streams) = consumers
                .last_mut()
                .and_then(|c| c["streams"].as_array_mut())
            {
                streams.push(stream);
            }
        } else {
            consumers.push(json!({
                "scope": row.scope,
                "protocol": if row.scope.is_empty() { "pico" } else { "durable-streams" },
                "consumer": row.id,
                "group": row.group,
                "streams": [stream],
            }));
        }
    }
    json_response(
        200,
        json!({
            "consumers": consumers,
            "total": total,
            "hasMore": truncated,
        }),
    )
}

/// The consumer lines of `/metrics`: how many consumers there are, and the lag of each
/// consumer's stream whose tail this node knows.
pub async fn metrics_text(state: &AdminState) -> String {
    let Ok(Rows { rows, total, .. }) = rows(state).await else {
        return String::new();
    };
    let mut out = String::new();
    out.push_str("# HELP pico_consumers Named consumers in the metadata log.\n");
    out.push_str("# TYPE pico_consumers gauge\n");
    out.push_str(&format!("pico_consumers {total}\n"));
    out.push_str(
        "# HELP pico_consumer_wakes_total Wake webhooks of named consumers this node POSTed, by result (a failed one gives its lease back and is retried).\n",
    );
    out.push_str("# TYPE pico_consumer_wakes_total counter\n");
    for (result, count) in [
        ("delivered", &crate::consumers::WAKES_DELIVERED),
        ("failed", &crate::consumers::WAKES_FAILED),
    ] {
        out.push_str(&format!(
            "pico_consumer_wakes_total{{result=\"{result}\"}} {}\n",
            count.load(std::sync::atomic::Ordering::Relaxed)
        ));
    }
    out.push_str(
        "# HELP pico_consumer_lag_records Records of a stream past its consumer's committed offset (streams this node serves).\n",
    );
    out.push_str("# TYPE pico_consumer_lag_records gauge\n");
    for row in rows {
        let Some(tail) = row.tail else { continue };
        out.push_str(&format!(
            "pico_consumer_lag_records{{scope=\"{}\",consumer=\"{}\",stream=\"{}\"}} {}\n",
            label(&row.scope),
            label(&row.id),
            label(&row.stream),
            tail.saturating_sub(row.next_seq)
        ));
    }
    out
}

/// A Prometheus label value: backslash, double quote and line feed escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_values_are_escaped() {
        assert_eq!(super::label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
