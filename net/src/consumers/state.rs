//! A named consumer's state and every rule that changes it, as pure functions: each request
//! reads the stored document, decides, and says what to write (`pico_meta::ConsumerWrite`);
//! the metadata thread runs the decision inside the transaction that writes it.
//!
//! The stored document (JSON, one per consumer, `consumers.document` in the metadata log):
//!
//! ```text
//! {"format": 1,
//!  "streams": [{"path": "/s/a", "next": [seq, bytes] | null}, ...],   registration order
//!  "lease_ttl_ms": 30000,
//!  "epoch": 3,                       +1 on every acquire; never goes down
//!  "holder": {"token_sha256": "<64 hex>", "lease_expires_ms": 1764...} | null,
//!  "created_ms": 1764...}
//! ```
//!
//! `next` is the position after the last processed byte (`null`: nothing processed, shown as
//! the offset `-1`); it only moves forward and never past the stream's tail. The consumer is
//! `READING` while it has a holder whose lease runs (judged by the metadata log's clock, the
//! database's in a cluster), `REGISTERED` otherwise: a lapsed lease needs no timer to end.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use pico_meta::{ConsumerRead, ConsumerWrite};
use pico_proto::offset::{self, Offset};

/// The document format this build writes and reads.
const FORMAT: u32 = 1;

/// Ids, bounded so a document stays small; `__wh__:` is reserved by the protocol.
pub const CONSUMER_ID_BYTES_MAX: usize = 256;
const RESERVED_ID_PREFIX: &str = "__wh__:";
/// Streams one consumer follows.
pub const STREAMS_PER_CONSUMER_MAX: usize = 256;
/// Consumers one scope (root or auth grant) holds.
pub const CONSUMERS_PER_SCOPE_MAX: u64 = 100_000;
/// The lease when a registration names none, and its bounds.
pub const LEASE_TTL_DEFAULT_MS: u64 = 30_000;
pub const LEASE_TTL_MIN_MS: u64 = 100;
pub const LEASE_TTL_MAX_MS: u64 = 3_600_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumer {
    pub format: u32,
    pub streams: Vec<StreamCursor>,
    pub lease_ttl_ms: u64,
    pub epoch: u64,
    pub holder: Option<Holder>,
    pub created_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCursor {
    pub path: String,
    /// `[seq, bytes]` after the last processed byte; `None`: nothing processed.
    pub next: Option<(u64, u64)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub token_sha256: String,
    pub lease_expires_ms: i64,
}

/// A refusal: status, protocol code and message (`{"error":{"code","message"}}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl ConsumerError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ConsumerError {
        ConsumerError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> ConsumerError {
        ConsumerError::new(400, "INVALID_REQUEST", message)
    }

    fn not_found() -> ConsumerError {
        ConsumerError::new(404, "CONSUMER_NOT_FOUND", "Consumer not found")
    }

    pub fn to_json(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

/// What a request is answered with when it succeeds.
pub type Answer = Result<(u16, Value), ConsumerError>;

/// A registration's body, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub streams: Vec<String>,
    pub lease_ttl_ms: Option<u64>,
}

/// An ack's body, checked for shape: `(path, offset)` pairs.
pub type AckOffsets = Vec<(String, Offset)>;

/// A consumer id from the URL or a body: non-empty, bounded, printable, not reserved.
pub fn check_id(id: &str) -> Result<(), ConsumerError> {
    if id.is_empty() || id.len() > CONSUMER_ID_BYTES_MAX {
        return Err(ConsumerError::invalid(format!(
            "consumer_id must be 1 to {CONSUMER_ID_BYTES_MAX} bytes"
        )));
    }
    if id.starts_with(RESERVED_ID_PREFIX) {
        return Err(ConsumerError::invalid(format!(
            "consumer ids starting {RESERVED_ID_PREFIX:?} are reserved"
        )));
    }
    if id.chars().any(char::is_control) {
        return Err(ConsumerError::invalid(
            "consumer_id must not hold control characters",
        ));
    }
    Ok(())
}

/// Parses `POST /consumers`: `{consumer_id, streams:[path...], lease_ttl_ms?}`.
pub fn parse_registration(body: &Value) -> Result<(String, Registration), ConsumerError> {
    let object = body
        .as_object()
        .ok_or_else(|| ConsumerError::invalid("the body must be a JSON object"))?;
    let id = object
        .get("consumer_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ConsumerError::invalid("consumer_id (a string) is required"))?;
    check_id(id)?;
    let list = object
        .get("streams")
        .and_then(Value::as_array)
        .ok_or_else(|| ConsumerError::invalid("streams (an array of paths) is required"))?;
    if list.is_empty() || list.len() > STREAMS_PER_CONSUMER_MAX {
        return Err(ConsumerError::invalid(format!(
            "streams must name 1 to {STREAMS_PER_CONSUMER_MAX} streams"
        )));
    }
    let mut streams = Vec::with_capacity(list.len());
    for entry in list {
        let path = entry
            .as_str()
            .filter(|p| p.starts_with('/') && p.len() <= pico_engine::limits::STREAM_NAME_LEN_MAX)
            .ok_or_else(|| {
                ConsumerError::invalid("every stream must be a path starting with '/'")
            })?;
        if !streams.iter().any(|s: &String| s == path) {
            streams.push(path.to_string());
        }
    }
    let lease_ttl_ms = match object.get("lease_ttl_ms") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_u64()
                .filter(|ms| (LEASE_TTL_MIN_MS..=LEASE_TTL_MAX_MS).contains(ms))
                .ok_or_else(|| {
                    ConsumerError::invalid(format!(
                        "lease_ttl_ms must be an integer from {LEASE_TTL_MIN_MS} to {LEASE_TTL_MAX_MS}"
                    ))
                })?,
        ),
    };
    Ok((
        id.to_string(),
        Registration {
            streams,
            lease_ttl_ms,
        },
    ))
}

/// Parses an ack's `{offsets:[{path, offset}]}`; a malformed entry refuses the whole ack.
pub fn parse_ack(body: &Value) -> Result<AckOffsets, ConsumerError> {
    let list = body
        .get("offsets")
        .and_then(Value::as_array)
        .ok_or_else(|| ConsumerError::invalid("offsets (an array) is required"))?;
    if list.len() > STREAMS_PER_CONSUMER_MAX {
        return Err(ConsumerError::invalid(format!(
            "an ack names at most {STREAMS_PER_CONSUMER_MAX} streams"
        )));
    }
    let mut offsets = Vec::with_capacity(list.len());
    for entry in list {
        let path = entry.get("path").and_then(Value::as_str);
        let text = entry.get("offset").and_then(Value::as_str);
        let (Some(path), Some(text)) = (path, text) else {
            return Err(ConsumerError::invalid(
                "every offsets entry needs a path and an offset (strings)",
            ));
        };
        let at = match offset::parse(text) {
            Some(at @ (Offset::Start | Offset::At { .. })) => at,
            _ => {
                return Err(ConsumerError::invalid(format!(
                    "invalid offset for {path}: {text:?}"
                )))
            }
        };
        offsets.push((path.to_string(), at));
    }
    Ok(offsets)
}

/// The offset text of a cursor: `-1` before anything is processed.
fn offset_text(next: Option<(u64, u64)>) -> String {
    match next {
        None => "-1".to_string(),
        Some((seq, bytes)) => offset::format(seq, bytes),
    }
}

/// A position as comparable `(seq, bytes)`; the start sorts first.
fn position(at: Offset) -> Option<(u64, u64)> {
    match at {
        Offset::At { seq, bytes } => Some((seq, bytes)),
        _ => None,
    }
}

impl Consumer {
    fn parse(document: &str) -> Result<Consumer, ConsumerError> {
        let consumer: Consumer = serde_json::from_str(document).map_err(|e| {
            ConsumerError::new(500, "INTERNAL", format!("stored consumer unreadable: {e}"))
        })?;
        if consumer.format != FORMAT {
            return Err(ConsumerError::new(
                500,
                "INTERNAL",
                format!(
                    "stored consumer has format {}, this build reads {FORMAT}",
                    consumer.format
                ),
            ));
        }
        Ok(consumer)
    }

    fn document(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether a holder's lease runs at `now_ms`.
    pub fn is_reading(&self, now_ms: i64) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|h| h.lease_expires_ms > now_ms)
    }

    /// The answer of `GET /consumers/{id}` (and of the other calls).
    pub fn view(&self, id: &str, now_ms: i64) -> Value {
        let state = if self.is_reading(now_ms) {
            "READING"
        } else {
            "REGISTERED"
        };
        let streams: Vec<Value> = self
            .streams
            .iter()
            .map(|s| json!({"path": s.path, "offset": offset_text(s.next)}))
            .collect();
        let mut view = json!({
            "consumer_id": id,
            "state": state,
            "epoch": self.epoch,
            "lease_ttl_ms": self.lease_ttl_ms,
            "streams": streams,
        });
        if let Some(holder) = self.holder.as_ref().filter(|_| state == "READING") {
            view["lease_expires_in_ms"] = json!(holder.lease_expires_ms.saturating_sub(now_ms));
        }
        view
    }

    fn lease_until(&self, now_ms: i64) -> i64 {
        now_ms.saturating_add(i64::try_from(self.lease_ttl_ms).unwrap_or(i64::MAX))
    }
}

fn stored(read: &ConsumerRead) -> Result<Consumer, ConsumerError> {
    match &read.document {
        Some(document) => Consumer::parse(document),
        None => Err(ConsumerError::not_found()),
    }
}

/// `POST /consumers`: registers, or finds the same registration again.
pub fn register(
    read: ConsumerRead,
    id: &str,
    registration: &Registration,
) -> (ConsumerWrite, Answer) {
    if read.document.is_some() {
        let existing = match stored(&read) {
            Ok(existing) => existing,
            Err(e) => return (ConsumerWrite::Keep, Err(e)),
        };
        let same_streams = existing.streams.len() == registration.streams.len()
            && registration
                .streams
                .iter()
                .all(|path| existing.streams.iter().any(|s| &s.path == path));
        let same_ttl = registration
            .lease_ttl_ms
            .is_none_or(|ttl| ttl == existing.lease_ttl_ms);
        if !(same_streams && same_ttl) {
            return (
                ConsumerWrite::Keep,
                Err(ConsumerError::new(
                    409,
                    "CONSUMER_ALREADY_EXISTS",
                    format!("consumer {id:?} exists with other streams or another lease"),
                )),
            );
        }
        return (
            ConsumerWrite::Keep,
            Ok((200, existing.view(id, read.now_ms))),
        );
    }
    if read.scope_count >= CONSUMERS_PER_SCOPE_MAX {
        return (
            ConsumerWrite::Keep,
            Err(ConsumerError::new(
                429,
                "LIMIT_EXCEEDED",
                format!("this scope holds {CONSUMERS_PER_SCOPE_MAX} consumers at most"),
            )),
        );
    }
    let consumer = Consumer {
        format: FORMAT,
        streams: registration
            .streams
            .iter()
            .map(|path| StreamCursor {
                path: path.clone(),
                next: None,
            })
            .collect(),
        lease_ttl_ms: registration.lease_ttl_ms.unwrap_or(LEASE_TTL_DEFAULT_MS),
        epoch: 0,
        holder: None,
        created_ms: read.now_ms,
    };
    let view = consumer.view(id, read.now_ms);
    (ConsumerWrite::Put(consumer.document()), Ok((201, view)))
}

/// `GET /consumers/{id}`.
pub fn describe(read: ConsumerRead, id: &str) -> (ConsumerWrite, Answer) {
    let answer = stored(&read).map(|c| (200, c.view(id, read.now_ms)));
    (ConsumerWrite::Keep, answer)
}

/// `DELETE /consumers/{id}`.
pub fn delete(read: ConsumerRead) -> (ConsumerWrite, Answer) {
    match stored(&read) {
        Ok(_) => (ConsumerWrite::Delete, Ok((204, Value::Null))),
        Err(e) => (ConsumerWrite::Keep, Err(e)),
    }
}

/// `POST /consumers/{id}/acquire`: a new epoch holds the consumer; `token` is its bearer
/// token (made by the caller from a system random source), of which only the digest is kept.
pub fn acquire(read: ConsumerRead, id: &str, token: &Token) -> (ConsumerWrite, Answer) {
    let mut consumer = match stored(&read) {
        Ok(c) => c,
        Err(e) => return (ConsumerWrite::Keep, Err(e)),
    };
    let Some(epoch) = consumer.epoch.checked_add(1) else {
        return (
            ConsumerWrite::Keep,
            Err(ConsumerError::new(409, "CONFLICT", "epochs exhausted")),
        );
    };
    consumer.epoch = epoch;
    consumer.holder = Some(Holder {
        token_sha256: token.digest_for(epoch),
        lease_expires_ms: consumer.lease_until(read.now_ms),
    });
    let mut view = consumer.view(id, read.now_ms);
    view["token"] = json!(token.text_for(epoch));
    (ConsumerWrite::Put(consumer.document()), Ok((200, view)))
}

/// A bearer token for one epoch: `<epoch>.<secret>`; the epoch in clear lets a superseded
/// holder be told `STALE_EPOCH` rather than a bare `401`.
pub struct Token {
    secret: String,
}

impl Token {
    /// `secret`: unguessable URL-safe text (the caller draws it from the system's random
    /// source).
    pub fn new(secret: String) -> Token {
        Token { secret }
    }

    fn text_for(&self, epoch: u64) -> String {
        format!("{epoch}.{}", self.secret)
    }

    fn digest_for(&self, epoch: u64) -> String {
        digest(&self.text_for(epoch))
    }
}

fn digest(text: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a holder's bearer token: the consumer must be `READING` under that very epoch.
fn check_holder(consumer: &Consumer, token: &str, now_ms: i64) -> Result<(), ConsumerError> {
    let epoch = token
        .split_once('.')
        .and_then(|(epoch, _)| epoch.parse::<u64>().ok())
        .ok_or_else(|| ConsumerError::new(401, "TOKEN_INVALID", "malformed consumer token"))?;
    if epoch < consumer.epoch {
        return Err(ConsumerError::new(
            409,
            "STALE_EPOCH",
            format!(
                "epoch {epoch} was superseded by epoch {}: acquire again",
                consumer.epoch
            ),
        ));
    }
    let holder = consumer.holder.as_ref();
    let matches = epoch == consumer.epoch
        && holder.is_some_and(|h| constant_time_eq(&h.token_sha256, &digest(token)));
    if !matches {
        // A released or lapsed holder's token still names the current epoch; any other
        // text is simply wrong.
        if epoch == consumer.epoch && holder.is_none() {
            return Err(ConsumerError::new(
                409,
                "CONSUMER_NOT_READING",
                "the consumer is not held (released or lease lapsed): acquire it",
            ));
        }
        return Err(ConsumerError::new(
            401,
            "TOKEN_INVALID",
            "unknown consumer token",
        ));
    }
    if !consumer.is_reading(now_ms) {
        return Err(ConsumerError::new(
            409,
            "CONSUMER_NOT_READING",
            "the lease lapsed: acquire the consumer again",
        ));
    }
    Ok(())
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// `POST /consumers/{id}/ack`: moves the named cursors, all or none; an empty list only
/// extends the lease. `tails` gives each named stream's tail as `(seq, bytes)` (read before
/// this transaction: tails only grow, so an offset within it stays within the tail), or
/// `None` where the stream does not exist.
pub fn ack(
    read: ConsumerRead,
    id: &str,
    token: &str,
    offsets: &AckOffsets,
    tails: &[Option<(u64, u64)>],
) -> (ConsumerWrite, Answer) {
    let mut consumer = match stored(&read) {
        Ok(c) => c,
        Err(e) => return (ConsumerWrite::Keep, Err(e)),
    };
    if let Err(e) = check_holder(&consumer, token, read.now_ms) {
        return (ConsumerWrite::Keep, Err(e));
    }
    let mut moves = Vec::with_capacity(offsets.len());
    for ((path, at), tail) in offsets.iter().zip(tails) {
        let Some(index) = consumer.streams.iter().position(|s| &s.path == path) else {
            return (
                ConsumerWrite::Keep,
                Err(ConsumerError::new(
                    400,
                    "UNKNOWN_STREAM",
                    format!("{path} is not a stream of consumer {id:?}"),
                )),
            );
        };
        let wanted = position(*at);
        if wanted < consumer.streams[index].next {
            return (
                ConsumerWrite::Keep,
                Err(ConsumerError::new(
                    409,
                    "OFFSET_REGRESSION",
                    format!(
                        "{path}: offset {} is behind the committed {}",
                        offset_text(wanted),
                        offset_text(consumer.streams[index].next)
                    ),
                )),
            );
        }
        if let Some(wanted) = wanted {
            if tail.is_none_or(|tail| wanted > tail) {
                return (
                    ConsumerWrite::Keep,
                    Err(ConsumerError::new(
                        409,
                        "INVALID_OFFSET",
                        format!(
                            "{path}: offset {} is past the stream's tail",
                            offset_text(Some(wanted))
                        ),
                    )),
                );
            }
        }
        moves.push((index, wanted));
    }
    for (index, wanted) in moves {
        consumer.streams[index].next = wanted.max(consumer.streams[index].next);
    }
    let lease = consumer.lease_until(read.now_ms);
    if let Some(holder) = consumer.holder.as_mut() {
        holder.lease_expires_ms = lease;
    }
    let view = consumer.view(id, read.now_ms);
    (ConsumerWrite::Put(consumer.document()), Ok((200, view)))
}

/// `POST /consumers/{id}/release`: back to `REGISTERED`, committed offsets kept.
pub fn release(read: ConsumerRead, id: &str, token: &str) -> (ConsumerWrite, Answer) {
    let mut consumer = match stored(&read) {
        Ok(c) => c,
        Err(e) => return (ConsumerWrite::Keep, Err(e)),
    };
    if let Err(e) = check_holder(&consumer, token, read.now_ms) {
        return (ConsumerWrite::Keep, Err(e));
    }
    consumer.holder = None;
    let view = consumer.view(id, read.now_ms);
    (ConsumerWrite::Put(consumer.document()), Ok((200, view)))
}

/// The paths a consumer document follows (for the lag gauges), or nothing when unreadable.
pub fn cursors(document: &str) -> Vec<StreamCursor> {
    Consumer::parse(document)
        .map(|c| c.streams)
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
