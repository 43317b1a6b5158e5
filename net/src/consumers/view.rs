//! How a consumer is shown in each protocol: Durable Streams names offsets by their opaque
//! text and errors `{"error":{"code","message"}}`; Pico names records by sequence number
//! (`offset` is the last one processed, `-1` for none, `next_seq` where reading resumes) and
//! errors `{"error":"code","message"}` with lower-case codes.

use serde_json::{json, Value};

use super::rules::{offset_text, Consumer, ConsumerError, Outcome, StreamCursor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    DurableStreams,
    Pico,
}

/// The body of a successful answer.
pub fn render(outcome: &Outcome, id: &str, dialect: Dialect) -> Value {
    let Some(consumer) = &outcome.consumer else {
        return Value::Null;
    };
    let now_ms = outcome.now_ms;
    let state = if consumer.is_reading(now_ms) {
        "READING"
    } else {
        "REGISTERED"
    };
    let mut view = match dialect {
        Dialect::DurableStreams => json!({
            "consumer_id": id,
            "state": state,
            "epoch": consumer.epoch,
            "lease_ttl_ms": consumer.lease_ttl_ms,
            "streams": consumer.streams.iter()
                .map(|s| json!({"path": s.path, "offset": offset_text(s.next)}))
                .collect::<Vec<_>>(),
        }),
        Dialect::Pico => json!({
            "consumer": id,
            "state": state,
            "group": consumer.group,
            "epoch": consumer.epoch,
            "lease_ttl_ms": consumer.lease_ttl_ms,
            "streams": consumer.streams.iter().map(|s| pico_cursor(s, consumer.group))
                .collect::<Vec<_>>(),
        }),
    };
    if let Some(holder) = consumer.holder.as_ref().filter(|_| state == "READING") {
        view["lease_expires_in_ms"] = json!(holder.lease_expires_ms.saturating_sub(now_ms));
    }
    if consumer.group {
        view["members"] = consumer
            .members
            .iter()
            .map(|m| {
                json!({
                    "member": m.id,
                    "epoch": m.epoch,
                    "live": m.lease_expires_ms > now_ms,
                    "lease_expires_in_ms": m.lease_expires_ms.saturating_sub(now_ms).max(0),
                    "streams": held_by(consumer, &m.id),
                })
            })
            .collect();
    }
    if let Some(wake) = &outcome.wake {
        view["wake"] = super::wake::Wake::view(wake);
    }
    if let Some(token) = &outcome.token {
        view["token"] = json!(token);
    }
    if let Some(member) = &outcome.member {
        view["member"] = json!(member);
        // What this member holds now: after a join or an ack, the group may have moved
        // streams to or from it.
        view["assignment"] = consumer
            .streams
            .iter()
            .filter(|s| s.holder.as_deref() == Some(member.as_str()))
            .map(|s| pico_cursor(s, true))
            .collect();
    }
    view
}

fn held_by(consumer: &Consumer, member: &str) -> Vec<String> {
    consumer
        .streams
        .iter()
        .filter(|s| s.holder.as_deref() == Some(member))
        .map(|s| s.path.clone())
        .collect()
}

/// Where reading resumes: the record after the last processed one, or the record a
/// byte-position ack (Durable Streams) stopped inside.
pub fn next_seq(cursor: &StreamCursor) -> u64 {
    cursor.next.map_or(0, |(seq, _)| seq)
}

fn pico_cursor(cursor: &StreamCursor, group: bool) -> Value {
    let next = next_seq(cursor);
    let last = i128::from(next) - 1;
    let mut view = json!({
        "stream": cursor.path,
        "offset": last,
        "next_seq": next,
    });
    if group {
        view["member"] = json!(cursor.holder);
        view["epoch"] = json!(cursor.epoch);
    }
    view
}

/// A Pico error code: the protocol's lower-case form.
pub fn pico_code(error: &ConsumerError) -> String {
    match error.code {
        "INVALID_REQUEST" => "bad_request".to_string(),
        "TOKEN_INVALID" | "TOKEN_REQUIRED" | "UNAUTHORIZED" => "unauthorized".to_string(),
        code => code.to_ascii_lowercase(),
    }
}
