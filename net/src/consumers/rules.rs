//! A named consumer's state and every rule that changes it, as pure functions: each request
//! reads the stored document, decides, and says what to write (`pico_meta::ConsumerWrite`);
//! the metadata thread runs the decision inside the transaction that writes it.
//!
//! The stored document (JSON, one per consumer, `consumers.document` in the metadata log):
//!
//! ```text
//! {"format": 1,
//!  "streams": [{"path": "/s/a", "next": [seq, bytes] | null,         registration order
//!               "incarnation": 42}, ...],     the stream `next` counts in; absent: not known
//!  "lease_ttl_ms": 30000,
//!  "epoch": 3,                       +1 on every acquire; never goes down
//!  "holder": {"token_sha256": "<64 hex>", "lease_expires_ms": 1764...} | null,
//!  "created_ms": 1764...}
//! ```
//!
//! `next` is the position after the last processed byte (`null`: nothing processed, shown as
//! the offset `-1`); it only moves forward and never past the stream's tail. `incarnation` is
//! the id of the stream it was counted in (ids are never reused): when the stream by that
//! name is deleted and created again, the cursor begins anew in the new one, as a reader that
//! never read it. The consumer is
//! `READING` while it has a holder whose lease runs (judged by the metadata log's clock, the
//! database's in a cluster), `REGISTERED` otherwise: a lapsed lease needs no timer to end.

use std::collections::BTreeMap;

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
    /// Single reader: +1 on every acquire. Group: +1 on every join (each member incarnation
    /// has its own).
    pub epoch: u64,
    /// Single reader: who holds the consumer.
    pub holder: Option<Holder>,
    pub created_ms: i64,
    /// A group spreads its streams over its members, each stream held by one at a time.
    #[serde(default)]
    pub group: bool,
    /// Group: the members whose leases ran at the last change, by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCursor {
    pub path: String,
    /// `[seq, bytes]` after the last processed byte; `None`: nothing processed.
    pub next: Option<(u64, u64)>,
    /// The id of the stream `next` counts in (`None`: not known yet: registered before the
    /// stream was created, or stored by a build that did not keep it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
    /// Group: the member holding the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Group: +1 on every hand-over of the stream.
    #[serde(default)]
    pub epoch: u64,
}

impl StreamCursor {
    /// Where the cursor stands in the stream whose id is `live`: as stored, unless it counted
    /// in another incarnation of the name, whose records are not the live stream's (then
    /// nothing is processed). A cursor that knew no incarnation keeps its position.
    pub fn next_in(&self, live: u64) -> Option<(u64, u64)> {
        match self.incarnation {
            Some(counted) if counted != live => None,
            _ => self.next,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub token_sha256: String,
    pub lease_expires_ms: i64,
}

/// One member incarnation of a group: a join makes a new one (a new epoch and token).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: String,
    pub epoch: u64,
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

    pub(super) fn not_found() -> ConsumerError {
        ConsumerError::new(404, "CONSUMER_NOT_FOUND", "Consumer not found")
    }

    pub fn to_json(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

/// What a request that succeeded answers: the consumer as it now is (`None` once deleted),
/// the new token of an acquire or a join, and the member the request was about.
#[derive(Debug)]
pub struct Outcome {
    pub status: u16,
    pub consumer: Option<Consumer>,
    pub token: Option<String>,
    pub member: Option<String>,
    pub now_ms: i64,
    /// The consumer's wake webhook as stored (`wake.rs`), shown with the consumer.
    pub wake: Option<String>,
}

pub type Answer = Result<Outcome, ConsumerError>;

fn outcome(status: u16, consumer: &Consumer, now_ms: i64) -> Outcome {
    Outcome {
        status,
        consumer: Some(consumer.clone()),
        token: None,
        member: None,
        now_ms,
        wake: None,
    }
}

/// A registration's body, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub streams: Vec<String>,
    pub lease_ttl_ms: Option<u64>,
    pub group: bool,
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
    let id = body
        .get("consumer_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ConsumerError::invalid("consumer_id (a string) is required"))?;
    check_id(id)?;
    // A Durable Streams consumer is a single reader: groups are the Pico protocol's.
    let registration = parse_settings(body, false)?;
    Ok((id.to_string(), registration))
}

/// Parses a registration's settings, `{streams, lease_ttl_ms?, group?}` (`group` read only
/// where `groups` allows it).
pub fn parse_settings(body: &Value, groups: bool) -> Result<Registration, ConsumerError> {
    let object = body
        .as_object()
        .ok_or_else(|| ConsumerError::invalid("the body must be a JSON object"))?;
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
    let group = match object.get("group") {
        Some(_) if !groups => false,
        None | Some(Value::Null) => false,
        Some(Value::Bool(group)) => *group,
        Some(_) => return Err(ConsumerError::invalid("group must be true or false")),
    };
    Ok(Registration {
        streams,
        lease_ttl_ms,
        group,
    })
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

impl Consumer {
    pub(super) fn parse(document: &str) -> Result<Consumer, ConsumerError> {
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

    pub(super) fn document(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether someone reads at `now_ms`: the holder's lease runs, or a member's (group).
    pub fn is_reading(&self, now_ms: i64) -> bool {
        if self.group {
            return self.members.iter().any(|m| m.lease_expires_ms > now_ms);
        }
        self.holder
            .as_ref()
            .is_some_and(|h| h.lease_expires_ms > now_ms)
    }

    pub(super) fn lease_until(&self, now_ms: i64) -> i64 {
        now_ms.saturating_add(i64::try_from(self.lease_ttl_ms).unwrap_or(i64::MAX))
    }

    /// Brings each cursor up to its stream's live incarnation (`incarnations`: the id of the
    /// live stream by each name), as [`StreamCursor::next_in`] places it. A name with no live
    /// stream leaves its cursor as it is.
    pub(super) fn follow_incarnations(&mut self, incarnations: &BTreeMap<String, u64>) {
        for cursor in &mut self.streams {
            let Some(&live) = incarnations.get(&cursor.path) else {
                continue;
            };
            cursor.next = cursor.next_in(live);
            cursor.incarnation = Some(live);
        }
    }
}

/// The stored consumer, its cursors brought up to the streams' live incarnations.
pub(super) fn stored(read: &ConsumerRead) -> Result<Consumer, ConsumerError> {
    match &read.document {
        Some(document) => {
            let mut consumer = Consumer::parse(document)?;
            consumer.follow_incarnations(&read.incarnations);
            Ok(consumer)
        }
        None => Err(ConsumerError::not_found()),
    }
}

/// The streams a stored consumer document follows (none when there is no document, or it does
/// not parse): the names whose live incarnations its decisions are given.
pub fn followed(document: Option<&str>) -> Vec<String> {
    document
        .and_then(|d| Consumer::parse(d).ok())
        .map(|c| c.streams.into_iter().map(|s| s.path).collect())
        .unwrap_or_default()
}

/// A followed stream's tail as its owning core answered it, for an ack: the position after
/// its last record, and the incarnation (stream id) that tail belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    pub at: (u64, u64),
    pub incarnation: u64,
}

/// Runs `change` on the stored consumer: a refusal writes nothing, a success writes the
/// consumer as `change` left it.
fn changing(
    read: &ConsumerRead,
    change: impl FnOnce(&mut Consumer) -> Answer,
) -> (ConsumerWrite, Answer) {
    let mut consumer = match stored(read) {
        Ok(c) => c,
        Err(e) => return (ConsumerWrite::Keep, Err(e)),
    };
    match change(&mut consumer) {
        Ok(mut outcome) => {
            outcome.consumer = Some(consumer.clone());
            outcome.wake = read.wake.clone();
            (ConsumerWrite::Put(consumer.document()), Ok(outcome))
        }
        Err(e) => (ConsumerWrite::Keep, Err(e)),
    }
}

/// Registers, or finds the same registration again (same streams in any order, same lease
/// when one is named, same kind).
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
        if !(same_streams && same_ttl && existing.group == registration.group) {
            return (
                ConsumerWrite::Keep,
                Err(ConsumerError::new(
                    409,
                    "CONSUMER_ALREADY_EXISTS",
                    format!("consumer {id:?} exists with other streams, lease or kind"),
                )),
            );
        }
        return (
            ConsumerWrite::Keep,
            Ok(outcome(200, &existing, read.now_ms)),
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
                incarnation: read.incarnations.get(path).copied(),
                holder: None,
                epoch: 0,
            })
            .collect(),
        lease_ttl_ms: registration.lease_ttl_ms.unwrap_or(LEASE_TTL_DEFAULT_MS),
        epoch: 0,
        holder: None,
        created_ms: read.now_ms,
        group: registration.group,
        members: Vec::new(),
    };
    let answer = outcome(201, &consumer, read.now_ms);
    (ConsumerWrite::Put(consumer.document()), Ok(answer))
}

/// Describes the consumer.
pub fn describe(read: ConsumerRead) -> (ConsumerWrite, Answer) {
    let answer = stored(&read).map(|c| Outcome {
        wake: read.wake.clone(),
        ..outcome(200, &c, read.now_ms)
    });
    (ConsumerWrite::Keep, answer)
}

/// Deletes the consumer.
pub fn delete(read: ConsumerRead) -> (ConsumerWrite, Answer) {
    match stored(&read) {
        Ok(_) => (
            ConsumerWrite::Delete,
            Ok(Outcome {
                status: 204,
                consumer: None,
                token: None,
                member: None,
                now_ms: read.now_ms,
                wake: None,
            }),
        ),
        Err(e) => (ConsumerWrite::Keep, Err(e)),
    }
}

/// Acquire (single reader) or join (group, as `member`): a new epoch, whose bearer `token`
/// (drawn by the caller from the system's random source) is answered once and kept as a
/// digest. A single reader's acquire supersedes the holder; a member's join supersedes that
/// member's earlier incarnation and rebalances the group's streams.
pub fn acquire(read: ConsumerRead, member: Option<&str>, token: &Token) -> (ConsumerWrite, Answer) {
    let now_ms = read.now_ms;
    changing(&read, |consumer| {
        let epoch = consumer
            .epoch
            .checked_add(1)
            .ok_or_else(|| ConsumerError::new(409, "CONFLICT", "epochs exhausted"))?;
        let lease_expires_ms = consumer.lease_until(now_ms);
        let member = if consumer.group {
            let member = member
                .ok_or_else(|| ConsumerError::invalid("a group is joined as a named member"))?;
            check_id(member)?;
            if consumer.members.len() >= MEMBERS_PER_GROUP_MAX
                && !consumer.members.iter().any(|m| m.id == member)
            {
                consumer.members.retain(|m| m.lease_expires_ms > now_ms);
                if consumer.members.len() >= MEMBERS_PER_GROUP_MAX {
                    return Err(ConsumerError::new(
                        429,
                        "LIMIT_EXCEEDED",
                        format!("a group has {MEMBERS_PER_GROUP_MAX} members at most"),
                    ));
                }
            }
            consumer.members.retain(|m| m.id != member);
            // The incarnation it replaces held streams: they change hands, even if back to
            // this member, so the old incarnation's acks name a stale epoch.
            for stream in &mut consumer.streams {
                if stream.holder.as_deref() == Some(member) {
                    stream.holder = None;
                    stream.epoch = stream.epoch.saturating_add(1);
                }
            }
            consumer.members.push(Member {
                id: member.to_string(),
                epoch,
                token_sha256: token.digest_for(epoch),
                lease_expires_ms,
            });
            consumer.members.sort_by(|a, b| a.id.cmp(&b.id));
            rebalance(consumer, now_ms);
            Some(member.to_string())
        } else {
            consumer.holder = Some(Holder {
                token_sha256: token.digest_for(epoch),
                lease_expires_ms,
            });
            None
        };
        consumer.epoch = epoch;
        Ok(Outcome {
            status: 200,
            consumer: None,
            token: Some(token.text_for(epoch)),
            member,
            now_ms,
            wake: None,
        })
    })
}

/// Members one group holds.
pub const MEMBERS_PER_GROUP_MAX: usize = 1_024;

/// Drops the members whose leases ran out and spreads the streams over the rest: each
/// member keeps what it holds up to its share (`streams / members`, one more for the first
/// `streams % members` that already hold that many), the rest go to the members holding
/// fewest. Every change of hands bumps the stream's epoch.
fn rebalance(consumer: &mut Consumer, now_ms: i64) {
    consumer.members.retain(|m| m.lease_expires_ms > now_ms);
    let live: Vec<String> = consumer.members.iter().map(|m| m.id.clone()).collect();
    let streams = consumer.streams.len();
    let mut counts = vec![0usize; live.len()];
    let index = |holder: &Option<String>| {
        holder
            .as_deref()
            .and_then(|h| live.iter().position(|m| m == h))
    };
    let mut keep = vec![false; streams];
    if !live.is_empty() {
        let base = streams / live.len();
        let mut extra = streams % live.len();
        for (i, stream) in consumer.streams.iter().enumerate() {
            if let Some(m) = index(&stream.holder) {
                if counts[m] < base {
                    counts[m] += 1;
                    keep[i] = true;
                }
            }
        }
        for (i, stream) in consumer.streams.iter().enumerate() {
            if let Some(m) = index(&stream.holder) {
                if !keep[i] && counts[m] == base && extra > 0 {
                    counts[m] += 1;
                    extra -= 1;
                    keep[i] = true;
                }
            }
        }
    }
    for (i, stream) in consumer.streams.iter_mut().enumerate() {
        if keep[i] {
            continue;
        }
        let to = counts
            .iter()
            .enumerate()
            .min_by_key(|(m, count)| (**count, *m))
            .map(|(m, _)| m);
        let holder = to.map(|m| {
            counts[m] += 1;
            live[m].clone()
        });
        if holder != stream.holder {
            stream.holder = holder;
            stream.epoch = stream.epoch.saturating_add(1);
        }
    }
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

    /// A token with 32 bytes of the system's randomness.
    pub fn random() -> Result<Token, ConsumerError> {
        use base64::Engine;
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| ConsumerError::new(503, "UNAVAILABLE", "no randomness for a token"))?;
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        Ok(Token::new(secret))
    }

    pub(super) fn text_for(&self, epoch: u64) -> String {
        format!("{epoch}.{}", self.secret)
    }

    pub(super) fn digest_for(&self, epoch: u64) -> String {
        digest(&self.text_for(epoch))
    }
}

fn digest(text: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn token_epoch(token: &str) -> Result<u64, ConsumerError> {
    token
        .split_once('.')
        .and_then(|(epoch, _)| epoch.parse::<u64>().ok())
        .ok_or_else(|| ConsumerError::new(401, "TOKEN_INVALID", "malformed consumer token"))
}

fn not_reading(why: &str) -> ConsumerError {
    ConsumerError::new(409, "CONSUMER_NOT_READING", why.to_string())
}

fn stale(message: String) -> ConsumerError {
    ConsumerError::new(409, "STALE_EPOCH", message)
}

/// Who a holder's token names: `None` for a single reader's holder, the member's index in a
/// group. The holder must be the current epoch (member incarnation) and its lease must run.
fn check_token(
    consumer: &Consumer,
    token: &str,
    now_ms: i64,
) -> Result<Option<usize>, ConsumerError> {
    let epoch = token_epoch(token)?;
    let unknown = || ConsumerError::new(401, "TOKEN_INVALID", "unknown consumer token");
    if consumer.group {
        let Some(at) = consumer.members.iter().position(|m| m.epoch == epoch) else {
            if epoch <= consumer.epoch {
                return Err(stale(format!(
                    "member incarnation {epoch} left the group or was superseded: join again"
                )));
            }
            return Err(unknown());
        };
        let member = &consumer.members[at];
        if !constant_time_eq(&member.token_sha256, &digest(token)) {
            return Err(unknown());
        }
        if member.lease_expires_ms <= now_ms {
            return Err(not_reading("the member's lease lapsed: join again"));
        }
        return Ok(Some(at));
    }
    if epoch < consumer.epoch {
        return Err(stale(format!(
            "epoch {epoch} was superseded by epoch {}: acquire again",
            consumer.epoch
        )));
    }
    let holder = consumer.holder.as_ref();
    let matches = epoch == consumer.epoch
        && holder.is_some_and(|h| constant_time_eq(&h.token_sha256, &digest(token)));
    if !matches {
        // A released holder's token still names the current epoch; any other text is wrong.
        if epoch == consumer.epoch && holder.is_none() {
            return Err(not_reading(
                "the consumer is not held (released or lease lapsed): acquire it",
            ));
        }
        return Err(unknown());
    }
    if !consumer.is_reading(now_ms) {
        return Err(not_reading("the lease lapsed: acquire the consumer again"));
    }
    Ok(None)
}

/// Acknowledges: moves the named cursors, all or none, and extends the holder's lease (an
/// empty list only extends it: a heartbeat). In a group each named stream must be held by
/// the acknowledging member; the answer carries the group's assignment after the rebalance
/// the ack ran. `tails` gives each named stream's tail as `(seq, bytes)`, read before this
/// transaction (tails only grow, so an offset within it stays within), `None` where the
/// stream does not exist.
pub fn ack(
    read: ConsumerRead,
    token: &str,
    offsets: &AckOffsets,
    tails: &[Option<Tail>],
) -> (ConsumerWrite, Answer) {
    let now_ms = read.now_ms;
    changing(&read, |consumer| {
        let member = check_token(consumer, token, now_ms)?;
        let member_id = member.map(|m| consumer.members[m].id.clone());
        let mut moves = Vec::with_capacity(offsets.len());
        for ((path, at), tail) in offsets.iter().zip(tails) {
            let index = consumer
                .streams
                .iter()
                .position(|s| &s.path == path)
                .ok_or_else(|| {
                    ConsumerError::new(
                        400,
                        "UNKNOWN_STREAM",
                        format!("{path} is not a stream of this consumer"),
                    )
                })?;
            let cursor = &consumer.streams[index];
            if let Some(member) = &member_id {
                if cursor.holder.as_ref() != Some(member) {
                    return Err(stale(format!(
                        "{path} is held by another member now (stream epoch {})",
                        cursor.epoch
                    )));
                }
            }
            if let (Some(tail), Some(counted)) = (tail, cursor.incarnation) {
                if tail.incarnation != counted {
                    // The owning core answered for another stream by this name than the
                    // metadata log holds: it was deleted or created while the ack was on its
                    // way.
                    return Err(ConsumerError::new(
                        503,
                        "UNAVAILABLE",
                        format!("{path} was deleted or created while the ack was on its way"),
                    ));
                }
            }
            let wanted = position(*at);
            if wanted < cursor.next {
                return Err(ConsumerError::new(
                    409,
                    "OFFSET_REGRESSION",
                    format!(
                        "{path}: offset {} is behind the committed {}",
                        position_text(wanted),
                        position_text(cursor.next)
                    ),
                ));
            }
            if let Some(wanted) = wanted {
                if tail.is_none_or(|tail| wanted > tail.at) {
                    return Err(ConsumerError::new(
                        409,
                        "INVALID_OFFSET",
                        format!(
                            "{path}: offset {} is past the stream's tail",
                            position_text(Some(wanted))
                        ),
                    ));
                }
            }
            moves.push((index, wanted, tail.map(|t| t.incarnation)));
        }
        for (index, wanted, incarnation) in moves {
            let cursor = &mut consumer.streams[index];
            cursor.next = wanted.max(cursor.next);
            // The position now counts in the stream whose tail bounded it.
            cursor.incarnation = incarnation.or(cursor.incarnation);
        }
        let lease = consumer.lease_until(now_ms);
        match member {
            Some(m) => {
                consumer.members[m].lease_expires_ms = lease;
                rebalance(consumer, now_ms);
            }
            None => {
                if let Some(holder) = consumer.holder.as_mut() {
                    holder.lease_expires_ms = lease;
                }
            }
        }
        Ok(Outcome {
            status: 200,
            consumer: None,
            token: None,
            member: member_id,
            now_ms,
            wake: None,
        })
    })
}

/// Releases: a single reader goes back to `REGISTERED`; a member leaves its group, whose
/// streams go to the others. Committed offsets stay.
pub fn release(read: ConsumerRead, token: &str) -> (ConsumerWrite, Answer) {
    let now_ms = read.now_ms;
    changing(&read, |consumer| {
        match check_token(consumer, token, now_ms)? {
            Some(m) => {
                consumer.members.remove(m);
                rebalance(consumer, now_ms);
            }
            None => consumer.holder = None,
        }
        Ok(outcome(200, consumer, now_ms))
    })
}

/// A stored consumer document's kind (group or not) and streams; `None` when unreadable.
pub fn outline(document: &str) -> Option<(bool, Vec<StreamCursor>)> {
    Consumer::parse(document).ok().map(|c| (c.group, c.streams))
}

/// The offset text of a cursor: `-1` before anything is processed.
pub fn offset_text(next: Option<(u64, u64)>) -> String {
    match next {
        None => "-1".to_string(),
        Some((seq, bytes)) => offset::format(seq, bytes),
    }
}

/// A position for messages, read by both protocols' clients: the offset text, and where it is
/// in records (Pico acks name the last record processed).
fn position_text(next: Option<(u64, u64)>) -> String {
    match next {
        None => "-1 (before the first record)".to_string(),
        Some((0, 0)) => format!("{} (before the first record)", offset_text(next)),
        Some((seq, 0)) => format!("{} (after record {})", offset_text(next), seq - 1),
        Some((seq, _)) => format!("{} (inside record {seq})", offset_text(next)),
    }
}

/// A position as comparable `(seq, bytes)`; the start sorts first.
fn position(at: Offset) -> Option<(u64, u64)> {
    match at {
        Offset::At { seq, bytes } => Some((seq, bytes)),
        _ => None,
    }
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
