//! The subscriptions of a node and their state machine, free of I/O: every transition takes a
//! `Clock` and returns the `Effect`s (webhook deliveries, wake-stream appends) for the caller to
//! carry out, so the lease and generation rules are unit-tested without a server.
//!
//! Per subscription: each linked stream has an acked offset (the consumer's committed cursor)
//! and the last tail seen; it is *pending* while tail > acked (offsets compare as strings). A
//! write to a pending stream with no wake outstanding starts a *wake*: the generation goes up,
//! and a webhook is POSTed or a pull-wake event appended. Callback tokens carry the generation,
//! so anything done with an older wake's token is `FENCED`. A wake ends with `done` (callback,
//! ack, synchronous webhook reply), a release, or its lease running out; then, if work is still
//! pending, the next wake starts at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{json, Value};

use super::glob;
use super::keys::{Claims, TokenError, TokenKey, TOKEN_TTL_SECS};
use super::percent::encode_component;

/// Subscriptions per node.
pub const MAX_SUBSCRIPTIONS: usize = 1024;
/// Linked streams per subscription (explicit and pattern-matched together); also bounds the
/// size of a wake notification, which lists them all.
pub const MAX_STREAMS_PER_SUBSCRIPTION: usize = 1000;
/// Acks in one callback or ack request.
pub const MAX_ACKS_PER_REQUEST: usize = 256;
/// Subscription ids, in bytes once percent-decoded.
pub const MAX_ID_LEN: usize = 256;
/// Relative stream paths and patterns, in bytes.
pub const MAX_PATH_LEN: usize = 1024;
pub const MAX_DESCRIPTION_LEN: usize = 4096;
pub const MAX_WORKER_LEN: usize = 256;
pub const DEFAULT_LEASE_TTL_MS: u64 = 30_000;
pub const MIN_LEASE_TTL_MS: u64 = 1_000;
pub const MAX_LEASE_TTL_MS: u64 = 600_000;
/// Failed POSTs of one wake before it is given up (the subscription is then `failed` until a
/// delivery succeeds; the next write to a pending stream starts a new wake).
pub const MAX_DELIVERY_ATTEMPTS: u32 = 8;
const RETRY_BASE_MS: u64 = 1_000;
const MAX_RETRY_DELAY_MS: u64 = 60_000;

/// The tail of an empty or missing stream.
pub const ZERO_OFFSET: &str = "0000000000000000_0000000000000000";
/// The acked offset of a stream linked by its first write: all of it is pending.
pub const BEFORE_FIRST_OFFSET: &str = "-1";

/// An error answer: `{"error":{"code":…,"message":…}}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// `ALREADY_CLAIMED` names the holder and the wake's generation.
    pub holder: Option<(String, u64)>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            holder: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "INVALID_REQUEST", message)
    }

    pub fn not_found() -> ApiError {
        ApiError::new(404, "SUBSCRIPTION_NOT_FOUND", "Subscription not found")
    }

    fn fenced() -> ApiError {
        ApiError::new(409, "FENCED", "Wake generation is stale")
    }

    fn offset(message: &str) -> ApiError {
        ApiError::new(409, "INVALID_OFFSET", message)
    }

    pub fn to_json(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some((holder, generation)) = &self.holder {
            error["current_holder"] = json!(holder);
            error["generation"] = json!(generation);
        }
        json!({ "error": error })
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> ApiError {
        match e {
            TokenError::Invalid => ApiError::new(401, "TOKEN_INVALID", "Token invalid"),
            TokenError::Expired => ApiError::new(401, "TOKEN_EXPIRED", "Token expired"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Webhook,
    PullWake,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::PullWake => "pull-wake",
        }
    }
}

/// What a `PUT` configures; an identical `PUT` re-confirms (`200`), a different one conflicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub kind: Kind,
    pub pattern: Option<String>,
    pub streams: BTreeSet<String>,
    pub webhook_url: Option<String>,
    pub wake_stream: Option<String>,
    pub lease_ttl_ms: u64,
    pub description: Option<String>,
}

fn optional_str<'a>(body: &'a Value, field: &str) -> Result<Option<&'a str>, ApiError> {
    match &body[field] {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s)),
        _ => Err(ApiError::invalid(format!("{field} must be a string"))),
    }
}

/// Strips leading and trailing slashes and checks a stream path relative to the root.
pub fn normalize_path(raw: &str) -> Result<String, ApiError> {
    let path = raw.trim_matches('/');
    if path.is_empty() || path.len() > MAX_PATH_LEN {
        return Err(ApiError::invalid(format!(
            "stream paths must be 1 to {MAX_PATH_LEN} bytes"
        )));
    }
    if path.chars().any(char::is_control)
        || path
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(ApiError::invalid(format!("invalid stream path {raw:?}")));
    }
    if path == "__ds" || path.starts_with("__ds/") {
        return Err(ApiError::invalid("__ds is reserved"));
    }
    Ok(path.to_string())
}

/// Parses a `streams` array of relative paths.
pub fn parse_streams(value: &Value) -> Result<BTreeSet<String>, ApiError> {
    let items = match value {
        Value::Null => return Ok(BTreeSet::new()),
        Value::Array(items) => items,
        _ => return Err(ApiError::invalid("streams must be an array of strings")),
    };
    if items.len() > MAX_STREAMS_PER_SUBSCRIPTION {
        return Err(limit_streams());
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => normalize_path(s),
            _ => Err(ApiError::invalid("streams must be an array of strings")),
        })
        .collect()
}

fn limit_streams() -> ApiError {
    ApiError::new(
        400,
        "LIMIT_EXCEEDED",
        format!("a subscription links at most {MAX_STREAMS_PER_SUBSCRIPTION} streams"),
    )
}

/// Parses the body of `PUT …/subscriptions/:id` (webhook URL safety is checked separately).
pub fn parse_config(body: &Value) -> Result<Config, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid("Request body must be a JSON object"));
    }
    let kind = match body["type"].as_str() {
        Some("webhook") => Kind::Webhook,
        Some("pull-wake") => Kind::PullWake,
        _ => {
            return Err(ApiError::invalid(
                r#"type must be "webhook" or "pull-wake""#,
            ))
        }
    };
    let pattern = match optional_str(body, "pattern")? {
        None => None,
        Some(raw) => {
            let pattern = raw.trim_matches('/').to_string();
            if pattern.len() > MAX_PATH_LEN {
                return Err(ApiError::invalid(format!(
                    "pattern is longer than {MAX_PATH_LEN} bytes"
                )));
            }
            glob::validate(&pattern).map_err(ApiError::invalid)?;
            Some(pattern)
        }
    };
    let streams = parse_streams(&body["streams"])?;
    if pattern.is_none() && streams.is_empty() {
        return Err(ApiError::invalid(
            "At least one of pattern or streams is required",
        ));
    }
    let lease_ttl_ms = match &body["lease_ttl_ms"] {
        Value::Null => DEFAULT_LEASE_TTL_MS,
        v => v
            .as_u64()
            .filter(|ms| (MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS).contains(ms))
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "lease_ttl_ms must be an integer from {MIN_LEASE_TTL_MS} to {MAX_LEASE_TTL_MS}"
                ))
            })?,
    };
    let webhook_url = match kind {
        Kind::Webhook => Some(
            body["webhook"]["url"]
                .as_str()
                .filter(|u| !u.is_empty())
                .ok_or_else(|| ApiError::invalid("webhook subscriptions require webhook.url"))?
                .to_string(),
        ),
        Kind::PullWake => None,
    };
    let wake_stream = match kind {
        Kind::PullWake => Some(normalize_path(
            optional_str(body, "wake_stream")?
                .ok_or_else(|| ApiError::invalid("pull-wake subscriptions require wake_stream"))?,
        )?),
        Kind::Webhook => None,
    };
    let description = optional_str(body, "description")?.map(str::to_string);
    if description
        .as_ref()
        .is_some_and(|d| d.len() > MAX_DESCRIPTION_LEN)
    {
        return Err(ApiError::invalid(format!(
            "description is longer than {MAX_DESCRIPTION_LEN} bytes"
        )));
    }
    Ok(Config {
        kind,
        pattern,
        streams,
        webhook_url,
        wake_stream,
        lease_ttl_ms,
        description,
    })
}

/// The body of a webhook callback, a pull-wake ack or a release.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AckRequest {
    pub wake_id: Option<String>,
    pub generation: Option<u64>,
    /// (relative stream path, offset)
    pub acks: Vec<(String, String)>,
    pub done: bool,
}

pub fn parse_ack_request(body: &Value) -> Result<AckRequest, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid("Request body must be a JSON object"));
    }
    let acks = match &body["acks"] {
        Value::Null => Vec::new(),
        Value::Array(items) if items.len() <= MAX_ACKS_PER_REQUEST => items
            .iter()
            .map(|ack| {
                let stream = ack["stream"]
                    .as_str()
                    .or_else(|| ack["path"].as_str())
                    .ok_or_else(|| ApiError::invalid("each ack needs stream and offset"))?;
                let offset = ack["offset"]
                    .as_str()
                    .ok_or_else(|| ApiError::invalid("each ack needs stream and offset"))?;
                Ok((normalize_path(stream)?, offset.to_string()))
            })
            .collect::<Result<_, ApiError>>()?,
        Value::Array(_) => {
            return Err(ApiError::invalid(format!(
                "at most {MAX_ACKS_PER_REQUEST} acks per request"
            )))
        }
        _ => return Err(ApiError::invalid("acks must be an array")),
    };
    Ok(AckRequest {
        wake_id: body["wake_id"].as_str().map(str::to_string),
        generation: body["generation"].as_u64(),
        acks,
        done: body["done"] == Value::Bool(true),
    })
}

/// `<digits>_<digits>`: the only offsets an ack may name.
fn is_offset(text: &str) -> bool {
    text.len() <= 64
        && text.split_once('_').is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        })
}

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub now: Instant,
    pub unix_ms: i64,
}

impl Clock {
    pub fn now() -> Clock {
        Clock {
            now: Instant::now(),
            unix_ms: pico_engine::now_ms(),
        }
    }

    fn unix_secs(&self) -> u64 {
        (self.unix_ms.max(0) / 1000) as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Explicit,
    Glob,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Link {
    explicit: bool,
    glob: bool,
    acked: String,
    tail: String,
}

impl Link {
    fn pending(&self) -> bool {
        self.tail > self.acked
    }

    fn link_type(&self) -> &'static str {
        if self.explicit {
            "explicit"
        } else {
            "glob"
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    /// Pull-wake: nothing is delivered.
    None,
    InFlight,
    RetryAt(Instant),
    Delivered,
}

#[derive(Debug)]
struct Wake {
    id: String,
    /// Pending streams and their tails when the wake started: what a synchronous `done`
    /// reply acknowledges.
    snapshot: Vec<(String, String)>,
    /// The pull-wake worker holding the lease.
    holder: Option<String>,
    /// Webhooks: from the start; pull-wake: from the claim.
    lease_until: Option<Instant>,
    delivery: Delivery,
}

#[derive(Debug)]
struct Sub {
    id: String,
    incarnation: u64,
    /// The DS root (ends with `/`); stream names are `root + relative path`.
    root: String,
    /// `base_url + root` of the creating request, for `callback_url`.
    callback_base: String,
    config: Config,
    created_at: String,
    failed: bool,
    streams: BTreeMap<String, Link>,
    generation: u64,
    wake: Option<Wake>,
    attempts: u32,
    overflow_warned: bool,
}

impl Sub {
    fn pending(&self) -> Option<&str> {
        self.streams
            .iter()
            .find(|(_, link)| link.pending())
            .map(|(path, _)| path.as_str())
    }

    fn relative<'a>(&self, full_path: &'a str) -> Option<&'a str> {
        let rel = full_path.strip_prefix(self.root.as_str())?;
        (!rel.is_empty() && rel != "__ds" && !rel.starts_with("__ds/")).then_some(rel)
    }

    /// A new stream matching the pattern (never the subscription's own wake stream, whose
    /// events would wake it forever).
    fn pattern_links(&self, rel: &str) -> bool {
        self.config
            .pattern
            .as_deref()
            .is_some_and(|p| glob::matches(p, rel))
            && self.config.wake_stream.as_deref() != Some(rel)
    }

    fn stream_infos(&self) -> Vec<Value> {
        self.streams
            .iter()
            .map(|(path, link)| {
                json!({
                    "path": path,
                    "link_type": link.link_type(),
                    "acked_offset": link.acked,
                    "tail_offset": link.tail,
                    "has_pending": link.pending(),
                })
            })
            .collect()
    }

    fn lease(&self) -> Duration {
        Duration::from_millis(self.config.lease_ttl_ms)
    }

    fn check_claims(&self, claims: &Claims) -> Result<(), ApiError> {
        if claims.subscription != self.id || claims.incarnation != self.incarnation {
            return Err(TokenError::Invalid.into());
        }
        Ok(())
    }

    fn fence(&self, claims: &Claims, request: &AckRequest) -> Result<(), ApiError> {
        let current = self.wake.as_ref().map(|w| w.id.as_str());
        if current.is_none()
            || claims.generation != self.generation
            || request.generation != Some(self.generation)
            || request.wake_id.as_deref() != current
        {
            return Err(ApiError::fenced());
        }
        Ok(())
    }
}

/// A webhook POST for the delivery thread; the result comes back keyed by the generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub subscription: String,
    pub incarnation: u64,
    pub generation: u64,
    pub url: String,
    pub body: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx with `{"done":true}`: the receiver finished the wake synchronously.
    Done,
    /// 2xx otherwise: the receiver will call back.
    Accepted,
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Deliver(Job),
    /// Append `event` (one JSON message) to the stream named `stream`.
    AppendWake {
        stream: String,
        event: String,
    },
}

/// What transitions need besides the subscription itself.
struct Ctx<'a> {
    tokens: &'a TokenKey,
    rng: &'a SystemRandom,
    clock: Clock,
    effects: &'a mut Vec<Effect>,
    /// The registry's `version`: bumped when durable state changes.
    version: &'a mut u64,
}

impl Ctx<'_> {
    fn touch(&mut self) {
        *self.version += 1;
    }

    fn token(&self, sub: &Sub) -> String {
        self.tokens.issue(&Claims {
            subscription: sub.id.clone(),
            incarnation: sub.incarnation,
            generation: sub.generation,
            expires_unix: self.clock.unix_secs() + TOKEN_TTL_SECS,
        })
    }

    fn wake_id(&self) -> String {
        let mut bytes = [0u8; 12];
        // SystemRandom fails only if the OS random source does; a fixed id then costs
        // unpredictability, not correctness (wake ids are compared, tokens are MACed).
        let _ = self.rng.fill(&mut bytes);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("w_{hex}")
    }

    fn webhook_job(&self, sub: &Sub) -> Option<Job> {
        let wake = sub.wake.as_ref()?;
        let body = json!({
            "subscription_id": sub.id,
            "wake_id": wake.id,
            "generation": sub.generation,
            "streams": sub.stream_infos(),
            "callback_url": format!(
                "{}__ds/subscriptions/{}/callback",
                sub.callback_base,
                encode_component(&sub.id)
            ),
            "callback_token": self.token(sub),
        });
        Some(Job {
            subscription: sub.id.clone(),
            incarnation: sub.incarnation,
            generation: sub.generation,
            url: sub.config.webhook_url.clone()?,
            body: body.to_string(),
        })
    }

    fn start_wake(&mut self, sub: &mut Sub, triggered_by: &str) {
        sub.generation += 1;
        // Persisted lazily: a generation lost in a crash is handed out again, but never with
        // the same wake id, so a token of the lost wake stays fenced.
        self.touch();
        let snapshot = sub
            .streams
            .iter()
            .filter(|(_, link)| link.pending())
            .map(|(path, link)| (path.clone(), link.tail.clone()))
            .collect();
        let webhook = sub.config.kind == Kind::Webhook;
        sub.wake = Some(Wake {
            id: self.wake_id(),
            snapshot,
            holder: None,
            lease_until: webhook.then(|| self.clock.now + sub.lease()),
            delivery: if webhook {
                Delivery::InFlight
            } else {
                Delivery::None
            },
        });
        if webhook {
            if let Some(job) = self.webhook_job(sub) {
                self.effects.push(Effect::Deliver(job));
            }
        } else if let Some(wake_stream) = &sub.config.wake_stream {
            let event = json!({
                "type": "wake",
                "subscription_id": sub.id,
                "stream": triggered_by,
                "generation": sub.generation,
                "wake_id": sub.wake.as_ref().map(|w| w.id.as_str()),
                "ts": self.clock.unix_ms,
            });
            self.effects.push(Effect::AppendWake {
                stream: format!("{}{}", sub.root, wake_stream),
                event: event.to_string(),
            });
        }
    }

    fn wake_if_pending(&mut self, sub: &mut Sub) -> bool {
        match sub.pending().map(str::to_string) {
            Some(first) => {
                self.start_wake(sub, &first);
                true
            }
            None => false,
        }
    }

    fn end_wake(&mut self, sub: &mut Sub) -> bool {
        sub.wake = None;
        self.wake_if_pending(sub)
    }

    /// Ends a wake whose lease ran out (lazily on every access, and from the sweeper).
    fn expire(&mut self, sub: &mut Sub) {
        let due = sub
            .wake
            .as_ref()
            .and_then(|w| w.lease_until)
            .is_some_and(|until| until <= self.clock.now);
        if due {
            log::debug!(
                "subscription {}: lease of generation {} expired",
                sub.id,
                sub.generation
            );
            self.end_wake(sub);
        }
    }
}

pub struct Registry {
    subs: HashMap<String, Sub>,
    tokens: TokenKey,
    rng: SystemRandom,
    /// Goes up whenever state that the state file keeps changes (see `snapshot`); the store
    /// compares it with the version it last wrote.
    version: u64,
    /// Restored from a file: the wakes that were outstanding are gone, so pending work is to be
    /// announced again (`resume`).
    resume: bool,
}

/// Splits the borrow: `subs` mutably, the rest for a `Ctx`.
macro_rules! ctx {
    ($self:ident, $clock:expr, $effects:expr) => {
        (
            &mut $self.subs,
            Ctx {
                tokens: &$self.tokens,
                rng: &$self.rng,
                clock: $clock,
                effects: $effects,
                version: &mut $self.version,
            },
        )
    };
}

impl Registry {
    pub fn new(tokens: TokenKey) -> Registry {
        Registry {
            subs: HashMap::new(),
            tokens,
            rng: SystemRandom::new(),
            version: 0,
            resume: false,
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn tokens(&self) -> &TokenKey {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.subs.len()
    }

    pub fn config(&self, id: &str) -> Option<&Config> {
        self.subs.get(id).map(|s| &s.config)
    }

    /// The root a subscription's stream names start with.
    pub fn root(&self, id: &str) -> Option<&str> {
        self.subs.get(id).map(|s| s.root.as_str())
    }

    /// Creates a subscription with its initial links (streams that already exist, acked at
    /// their current tails so only later writes are pending). `Ok(false)`: the same
    /// configuration already existed.
    pub fn create(
        &mut self,
        id: &str,
        root: &str,
        callback_base: &str,
        config: Config,
        links: Vec<(String, LinkKind, String)>,
        clock: Clock,
    ) -> Result<bool, ApiError> {
        if let Some(existing) = self.subs.get(id) {
            return if existing.config == config {
                Ok(false)
            } else {
                Err(ApiError::new(
                    409,
                    "SUBSCRIPTION_ALREADY_EXISTS",
                    "Subscription already exists with different configuration",
                ))
            };
        }
        if self.subs.len() >= MAX_SUBSCRIPTIONS {
            return Err(ApiError::new(
                429,
                "LIMIT_EXCEEDED",
                format!("this node holds at most {MAX_SUBSCRIPTIONS} subscriptions"),
            ));
        }
        let mut streams: BTreeMap<String, Link> = BTreeMap::new();
        for (path, kind, tail) in links {
            let link = streams.entry(path).or_insert_with(|| Link {
                explicit: false,
                glob: false,
                acked: tail.clone(),
                tail,
            });
            match kind {
                LinkKind::Explicit => link.explicit = true,
                LinkKind::Glob => link.glob = true,
            }
        }
        if streams.len() > MAX_STREAMS_PER_SUBSCRIPTION {
            return Err(limit_streams());
        }
        let mut incarnation = [0u8; 8];
        let _ = self.rng.fill(&mut incarnation);
        self.subs.insert(
            id.to_string(),
            Sub {
                id: id.to_string(),
                incarnation: u64::from_le_bytes(incarnation),
                root: root.to_string(),
                callback_base: callback_base.to_string(),
                config,
                created_at: crate::time::format_rfc3339_ms(clock.unix_ms),
                failed: false,
                streams,
                generation: 0,
                wake: None,
                attempts: 0,
                overflow_warned: false,
            },
        );
        self.version += 1;
        Ok(true)
    }

    /// The JSON of `GET …/subscriptions/:id` (no secrets: tokens are never listed).
    pub fn describe(&self, id: &str, kid: &str, jwks_url: &str) -> Option<Value> {
        let sub = self.subs.get(id)?;
        let streams: Vec<Value> = sub
            .streams
            .iter()
            .map(|(path, link)| {
                json!({"path": path, "link_type": link.link_type(), "acked_offset": link.acked})
            })
            .collect();
        let mut body = json!({
            "id": sub.id,
            "subscription_id": sub.id,
            "type": sub.config.kind.as_str(),
            "streams": streams,
            "lease_ttl_ms": sub.config.lease_ttl_ms,
            "created_at": sub.created_at,
            "status": if sub.failed { "failed" } else { "active" },
        });
        if let Some(pattern) = &sub.config.pattern {
            body["pattern"] = json!(pattern);
        }
        if let Some(url) = &sub.config.webhook_url {
            body["webhook"] = json!({
                "url": url,
                "signing": {"alg": "ed25519", "kid": kid, "jwks_url": jwks_url},
            });
        }
        if let Some(wake_stream) = &sub.config.wake_stream {
            body["wake_stream"] = json!(wake_stream);
        }
        if let Some(description) = &sub.config.description {
            body["description"] = json!(description);
        }
        Some(body)
    }

    pub fn delete(&mut self, id: &str) -> bool {
        let removed = self.subs.remove(id).is_some();
        if removed {
            self.version += 1;
        }
        removed
    }

    /// Links explicit streams, each with its current tail (an already linked stream keeps its
    /// acked offset).
    pub fn add_explicit(&mut self, id: &str, links: Vec<(String, String)>) -> Result<(), ApiError> {
        let sub = self.subs.get_mut(id).ok_or_else(ApiError::not_found)?;
        let new = links
            .iter()
            .map(|(path, _)| path)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|path| !sub.streams.contains_key(*path))
            .count();
        if sub.streams.len() + new > MAX_STREAMS_PER_SUBSCRIPTION {
            return Err(limit_streams());
        }
        for (path, tail) in links {
            sub.streams
                .entry(path)
                .or_insert_with(|| Link {
                    explicit: false,
                    glob: false,
                    acked: tail.clone(),
                    tail,
                })
                .explicit = true;
        }
        self.version += 1;
        Ok(())
    }

    /// Unlinks an explicit stream (a pattern link of the same stream stays).
    pub fn remove_explicit(&mut self, id: &str, path: &str) -> Result<(), ApiError> {
        let sub = self.subs.get_mut(id).ok_or_else(ApiError::not_found)?;
        if let Some(link) = sub.streams.get_mut(path) {
            link.explicit = false;
            if !link.glob {
                sub.streams.remove(path);
            }
            self.version += 1;
        }
        Ok(())
    }

    /// Whether a write to `full_path` concerns any subscription (checked under a read lock
    /// before taking the write lock).
    pub fn interested(&self, full_path: &str) -> bool {
        self.subs.values().any(|sub| {
            sub.relative(full_path)
                .is_some_and(|rel| sub.streams.contains_key(rel) || sub.pattern_links(rel))
        })
    }

    /// A successful write left `full_path` with tail `tail`.
    pub fn on_write(&mut self, full_path: &str, tail: &str, clock: Clock) -> Vec<Effect> {
        let mut effects = Vec::new();
        let (subs, mut ctx) = ctx!(self, clock, &mut effects);
        for sub in subs.values_mut() {
            let Some(rel) = sub.relative(full_path) else {
                continue;
            };
            let by_pattern = sub.pattern_links(rel);
            if by_pattern && !sub.streams.contains_key(rel) {
                if sub.streams.len() >= MAX_STREAMS_PER_SUBSCRIPTION {
                    if !sub.overflow_warned {
                        sub.overflow_warned = true;
                        log::warn!(
                            "subscription {}: pattern matches more than {MAX_STREAMS_PER_SUBSCRIPTION} streams; {rel} and later ones are not linked",
                            sub.id
                        );
                    }
                    continue;
                }
                sub.streams.insert(
                    rel.to_string(),
                    Link {
                        explicit: false,
                        glob: true,
                        acked: BEFORE_FIRST_OFFSET.to_string(),
                        tail: ZERO_OFFSET.to_string(),
                    },
                );
                ctx.touch();
            }
            let Some(link) = sub.streams.get_mut(rel) else {
                continue;
            };
            if by_pattern && !link.glob {
                link.glob = true;
                ctx.touch();
            }
            // Writes on different cores may report out of order: tails only move forward.
            if tail > link.tail.as_str() {
                link.tail = tail.to_string();
            }
            ctx.expire(sub);
            if sub.wake.is_none() {
                ctx.wake_if_pending(sub);
            }
        }
        effects
    }

    /// The stream was deleted: a later stream of the same name starts from scratch.
    pub fn on_delete(&mut self, full_path: &str) {
        for sub in self.subs.values_mut() {
            if let Some(rel) = sub.relative(full_path) {
                if sub.streams.remove(rel).is_some() {
                    self.version += 1;
                }
            }
        }
    }

    /// Moves linked streams' tails forward to ones just read from the engine (before acks are
    /// checked against them: writes that bypassed the DS protocol were not reported).
    pub fn refresh_tails(&mut self, id: &str, tails: &[(String, String)]) {
        let Some(sub) = self.subs.get_mut(id) else {
            return;
        };
        for (path, tail) in tails {
            if let Some(link) = sub.streams.get_mut(path) {
                if *tail > link.tail {
                    link.tail = tail.clone();
                }
            }
        }
    }

    /// A webhook callback (`kind` webhook) or a pull-wake ack: applies the acks, extends the
    /// lease, and with `done` ends the wake. Returns whether a next wake started.
    pub fn settle(
        &mut self,
        id: &str,
        kind: Kind,
        token: &str,
        request: &AckRequest,
        clock: Clock,
        effects: &mut Vec<Effect>,
    ) -> Result<bool, ApiError> {
        let claims = self.tokens.verify(token, clock.unix_secs());
        let (subs, mut ctx) = ctx!(self, clock, effects);
        let sub = subs.get_mut(id).ok_or_else(ApiError::not_found)?;
        if sub.config.kind != kind {
            return Err(ApiError::invalid(match kind {
                Kind::Webhook => "Subscription is not a webhook subscription",
                Kind::PullWake => "Subscription is not pull-wake",
            }));
        }
        let claims = claims?;
        sub.check_claims(&claims)?;
        ctx.expire(sub);
        sub.fence(&claims, request)?;
        for (path, offset) in &request.acks {
            let link = sub
                .streams
                .get(path)
                .ok_or_else(|| ApiError::offset("Ack references an unknown subscription stream"))?;
            if !is_offset(offset) {
                return Err(ApiError::offset("Ack offset is not a stream offset"));
            }
            if offset.as_str() < link.acked.as_str() {
                return Err(ApiError::offset(
                    "Ack offset regresses the committed cursor",
                ));
            }
            if offset.as_str() > link.tail.as_str() {
                return Err(ApiError::offset("Ack offset is beyond stream tail"));
            }
        }
        for (path, offset) in &request.acks {
            if let Some(link) = sub.streams.get_mut(path) {
                link.acked = offset.clone();
            }
        }
        if !request.acks.is_empty() {
            ctx.touch();
        }
        let lease = sub.lease();
        if let Some(wake) = sub.wake.as_mut() {
            wake.lease_until = Some(clock.now + lease);
        }
        Ok(request.done && ctx.end_wake(sub))
    }

    /// Takes the pull-wake lease for `worker`, starting a wake if none is outstanding.
    pub fn claim(
        &mut self,
        id: &str,
        worker: &str,
        clock: Clock,
        effects: &mut Vec<Effect>,
    ) -> Result<Value, ApiError> {
        let (subs, mut ctx) = ctx!(self, clock, effects);
        let sub = subs.get_mut(id).ok_or_else(ApiError::not_found)?;
        if sub.config.kind != Kind::PullWake {
            return Err(ApiError::invalid("Subscription is not pull-wake"));
        }
        ctx.expire(sub);
        if let Some(holder) = sub.wake.as_ref().and_then(|w| w.holder.clone()) {
            return Err(ApiError {
                holder: Some((holder, sub.generation)),
                ..ApiError::new(409, "ALREADY_CLAIMED", "Subscription is already claimed")
            });
        }
        if sub.wake.is_none() && !ctx.wake_if_pending(sub) {
            return Err(ApiError::new(
                409,
                "NO_PENDING_WORK",
                "Subscription has no pending work",
            ));
        }
        let lease = sub.lease();
        let token = ctx.token(sub);
        let Some(wake) = sub.wake.as_mut() else {
            return Err(ApiError::not_found());
        };
        wake.holder = Some(worker.to_string());
        wake.lease_until = Some(clock.now + lease);
        Ok(json!({
            "wake_id": wake.id,
            "generation": sub.generation,
            "token": token,
            "streams": sub.stream_infos(),
            "lease_ttl_ms": sub.config.lease_ttl_ms,
        }))
    }

    /// Gives a pull-wake lease back without acking; pending work starts the next wake.
    pub fn release(
        &mut self,
        id: &str,
        token: &str,
        request: &AckRequest,
        clock: Clock,
        effects: &mut Vec<Effect>,
    ) -> Result<(), ApiError> {
        let claims = self.tokens.verify(token, clock.unix_secs());
        let (subs, mut ctx) = ctx!(self, clock, effects);
        let sub = subs.get_mut(id).ok_or_else(ApiError::not_found)?;
        if sub.config.kind != Kind::PullWake {
            return Err(ApiError::invalid("Subscription is not pull-wake"));
        }
        let claims = claims?;
        sub.check_claims(&claims)?;
        ctx.expire(sub);
        sub.fence(&claims, request)?;
        ctx.end_wake(sub);
        Ok(())
    }

    /// Timers: expired leases end their wakes; webhook retries that are due go out again.
    pub fn tick(&mut self, clock: Clock) -> Vec<Effect> {
        let mut effects = Vec::new();
        let (subs, mut ctx) = ctx!(self, clock, &mut effects);
        for sub in subs.values_mut() {
            ctx.expire(sub);
            let retry_due = sub
                .wake
                .as_ref()
                .is_some_and(|w| matches!(w.delivery, Delivery::RetryAt(at) if at <= clock.now));
            if retry_due {
                if let Some(job) = ctx.webhook_job(sub) {
                    ctx.effects.push(Effect::Deliver(job));
                }
                if let Some(wake) = sub.wake.as_mut() {
                    wake.delivery = Delivery::InFlight;
                }
            }
        }
        effects
    }

    /// The result of a webhook POST. Results of a wake that already ended are ignored.
    pub fn delivery_result(&mut self, job: &Job, outcome: Outcome, clock: Clock) -> Vec<Effect> {
        let mut effects = Vec::new();
        let (subs, mut ctx) = ctx!(self, clock, &mut effects);
        let Some(sub) = subs.get_mut(&job.subscription) else {
            return effects;
        };
        if sub.incarnation != job.incarnation || sub.generation != job.generation {
            return effects;
        }
        let lease = sub.lease();
        let Some(wake) = sub.wake.as_mut() else {
            return effects;
        };
        match outcome {
            Outcome::Done => {
                for (path, tail) in std::mem::take(&mut wake.snapshot) {
                    if let Some(link) = sub.streams.get_mut(&path) {
                        if tail > link.acked {
                            link.acked = tail;
                        }
                    }
                }
                ctx.touch();
                sub.failed = false;
                sub.attempts = 0;
                ctx.end_wake(sub);
            }
            Outcome::Accepted => {
                if sub.failed {
                    ctx.touch();
                }
                sub.failed = false;
                sub.attempts = 0;
                wake.delivery = Delivery::Delivered;
                // The receiver has the wake from now on: it gets a whole lease to call back.
                wake.lease_until = Some(clock.now + lease);
            }
            Outcome::Failed(reason) => {
                if !sub.failed {
                    ctx.touch();
                }
                sub.failed = true;
                sub.attempts += 1;
                if sub.attempts >= MAX_DELIVERY_ATTEMPTS {
                    log::warn!(
                        "subscription {}: giving up generation {} after {} failed deliveries (last: {reason})",
                        sub.id, sub.generation, sub.attempts
                    );
                    sub.attempts = 0;
                    sub.wake = None;
                } else {
                    log::info!(
                        "subscription {}: delivery {} failed: {reason}",
                        sub.id,
                        sub.attempts
                    );
                    let due = clock.now + retry_delay(sub.attempts);
                    wake.delivery = Delivery::RetryAt(due);
                    // No lease runs out while a retry is still to come.
                    wake.lease_until = Some(due + lease);
                }
            }
        }
        effects
    }
}

/// The durable state: what the state file keeps and `restore` reads back. Wakes (leases,
/// holders, in-flight and retried deliveries, their attempt counts) are left out: after a
/// restart they are simply gone, as if their leases had run out, and `resume` announces the
/// pending work again with a new generation.
impl Registry {
    /// The subscriptions as JSON (without the keys, which `store` adds).
    pub fn snapshot(&self) -> Value {
        let mut subs: Vec<&Sub> = self.subs.values().collect();
        subs.sort_by(|a, b| a.id.cmp(&b.id));
        let subs: Vec<Value> = subs
            .into_iter()
            .map(|sub| {
                let streams: Vec<Value> = sub
                    .streams
                    .iter()
                    .map(|(path, link)| {
                        json!({
                            "path": path,
                            "explicit": link.explicit,
                            "glob": link.glob,
                            "acked": link.acked,
                            "tail": link.tail,
                        })
                    })
                    .collect();
                json!({
                    "id": sub.id,
                    "incarnation": sub.incarnation,
                    "root": sub.root,
                    "callback_base": sub.callback_base,
                    "created_at": sub.created_at,
                    "config": config_body(&sub.config),
                    "failed": sub.failed,
                    "generation": sub.generation,
                    "streams": streams,
                })
            })
            .collect();
        Value::Array(subs)
    }

    /// The registry `snapshot` wrote, with the token key of the same file. Anything missing or
    /// malformed is an error: a file this node did not write is not half-trusted.
    pub fn restore(snapshot: &Value, tokens: TokenKey) -> Result<Registry, String> {
        let items = snapshot.as_array().ok_or("subscriptions is not an array")?;
        if items.len() > MAX_SUBSCRIPTIONS {
            return Err(format!(
                "{} subscriptions, more than the {MAX_SUBSCRIPTIONS} a node holds",
                items.len()
            ));
        }
        let mut registry = Registry::new(tokens);
        for (index, item) in items.iter().enumerate() {
            let sub = restore_sub(item).map_err(|e| format!("subscription {index}: {e}"))?;
            if registry.subs.contains_key(&sub.id) {
                return Err(format!("subscription {index}: duplicate id {:?}", sub.id));
            }
            registry.subs.insert(sub.id.clone(), sub);
        }
        registry.resume = !registry.subs.is_empty();
        Ok(registry)
    }

    /// Whether `resume` is still to run.
    pub fn resume_pending(&self) -> bool {
        self.resume
    }

    /// Every linked stream per subscription, as (id, [(relative path, full name)]): for the
    /// sweeper to read their tails from the engine before `resume`.
    pub fn linked_streams(&self) -> Vec<(String, Vec<(String, String)>)> {
        self.subs
            .values()
            .map(|sub| {
                let streams = sub
                    .streams
                    .keys()
                    .map(|path| (path.clone(), format!("{}{path}", sub.root)))
                    .collect();
                (sub.id.clone(), streams)
            })
            .collect()
    }

    /// Once after a restore: starts a wake for every subscription with pending work (the wakes
    /// that were outstanding did not survive the restart).
    pub fn resume(&mut self, clock: Clock) -> Vec<Effect> {
        let mut effects = Vec::new();
        if !std::mem::take(&mut self.resume) {
            return effects;
        }
        let (subs, mut ctx) = ctx!(self, clock, &mut effects);
        for sub in subs.values_mut() {
            if sub.wake.is_none() {
                ctx.wake_if_pending(sub);
            }
        }
        effects
    }
}

/// A `Config` as the `PUT` body that configures it, so `restore` reads it with `parse_config`
/// (and its checks).
fn config_body(config: &Config) -> Value {
    let mut body = json!({
        "type": config.kind.as_str(),
        "streams": config.streams,
        "lease_ttl_ms": config.lease_ttl_ms,
    });
    if let Some(pattern) = &config.pattern {
        body["pattern"] = json!(pattern);
    }
    if let Some(url) = &config.webhook_url {
        body["webhook"] = json!({ "url": url });
    }
    if let Some(wake_stream) = &config.wake_stream {
        body["wake_stream"] = json!(wake_stream);
    }
    if let Some(description) = &config.description {
        body["description"] = json!(description);
    }
    body
}

fn str_field<'a>(value: &'a Value, field: &str) -> Result<&'a str, String> {
    value[field]
        .as_str()
        .ok_or_else(|| format!("{field} is not a string"))
}

fn u64_field(value: &Value, field: &str) -> Result<u64, String> {
    value[field]
        .as_u64()
        .ok_or_else(|| format!("{field} is not an unsigned integer"))
}

fn bool_field(value: &Value, field: &str) -> Result<bool, String> {
    value[field]
        .as_bool()
        .ok_or_else(|| format!("{field} is not a boolean"))
}

fn restore_sub(item: &Value) -> Result<Sub, String> {
    let id = str_field(item, "id")?;
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("invalid id {id:?}"));
    }
    let config = parse_config(&item["config"]).map_err(|e| format!("config: {}", e.message))?;
    let root = str_field(item, "root")?;
    if !root.ends_with('/') {
        return Err(format!("root {root:?} does not end with '/'"));
    }
    let items = item["streams"]
        .as_array()
        .ok_or("streams is not an array")?;
    if items.len() > MAX_STREAMS_PER_SUBSCRIPTION {
        return Err(format!("{} linked streams", items.len()));
    }
    let mut streams = BTreeMap::new();
    for stream in items {
        let path = normalize_path(str_field(stream, "path")?)
            .map_err(|e| format!("stream path: {}", e.message))?;
        let link = Link {
            explicit: bool_field(stream, "explicit")?,
            glob: bool_field(stream, "glob")?,
            acked: str_field(stream, "acked")?.to_string(),
            tail: str_field(stream, "tail")?.to_string(),
        };
        if !link.explicit && !link.glob {
            return Err(format!(
                "stream {path:?} is linked neither explicitly nor by pattern"
            ));
        }
        if streams.insert(path.clone(), link).is_some() {
            return Err(format!("stream {path:?} is listed twice"));
        }
    }
    Ok(Sub {
        id: id.to_string(),
        incarnation: u64_field(item, "incarnation")?,
        root: root.to_string(),
        callback_base: str_field(item, "callback_base")?.to_string(),
        config,
        created_at: str_field(item, "created_at")?.to_string(),
        failed: bool_field(item, "failed")?,
        streams,
        generation: u64_field(item, "generation")?,
        wake: None,
        attempts: 0,
        overflow_warned: false,
    })
}

/// 1 s, 2 s, 4 s … capped at a minute.
fn retry_delay(attempts: u32) -> Duration {
    let ms = RETRY_BASE_MS.saturating_mul(1u64 << attempts.saturating_sub(1).min(16));
    Duration::from_millis(ms.min(MAX_RETRY_DELAY_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_subscription_body(body in crate::fuzzing::inputs("subscription_body")) {
            if let Ok(value) = serde_json::from_slice::<Value>(&body) {
                let _ = parse_config(&value);
                let _ = parse_ack_request(&value);
                let _ = parse_streams(&value["streams"]);
                if let Some(path) = value["path"].as_str() {
                    let _ = normalize_path(path);
                }
            }
        }
    }

    const ROOT: &str = "/v1/stream/";
    const BASE: &str = "http://127.0.0.1:4437/v1/stream/";

    fn offset(n: u64) -> String {
        crate::ds::format_offset(n, 0)
    }

    fn registry() -> Registry {
        Registry::new(TokenKey::generate(&SystemRandom::new()).unwrap())
    }

    fn config(body: Value) -> Config {
        parse_config(&body).unwrap()
    }

    fn webhook(lease: u64) -> Config {
        config(json!({"type": "webhook", "pattern": "events/*",
            "webhook": {"url": "http://127.0.0.1:9/hook"}, "lease_ttl_ms": lease}))
    }

    fn pull(lease: u64) -> Config {
        config(json!({"type": "pull-wake", "pattern": "events/*",
            "wake_stream": "wake/pool", "lease_ttl_ms": lease}))
    }

    fn job_of(effects: &[Effect]) -> (Job, Value) {
        let jobs: Vec<&Job> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Deliver(job) => Some(job),
                _ => None,
            })
            .collect();
        assert_eq!(jobs.len(), 1, "{effects:?}");
        let body = serde_json::from_str(&jobs[0].body).unwrap();
        (jobs[0].clone(), body)
    }

    fn ack_request(body: &Value, path: &str, offset: &str, done: bool) -> AckRequest {
        AckRequest {
            wake_id: body["wake_id"].as_str().map(str::to_string),
            generation: body["generation"].as_u64(),
            acks: vec![(path.to_string(), offset.to_string())],
            done,
        }
    }

    #[test]
    fn config_parsing_and_defaults() {
        let c = webhook(1000);
        assert_eq!(c.kind, Kind::Webhook);
        assert_eq!(c.pattern.as_deref(), Some("events/*"));
        assert_eq!(c.lease_ttl_ms, 1000);
        let c = config(json!({"type": "pull-wake", "streams": ["/a/", "b"], "wake_stream": "w"}));
        assert_eq!(c.lease_ttl_ms, DEFAULT_LEASE_TTL_MS);
        assert_eq!(c.streams.iter().collect::<Vec<_>>(), ["a", "b"]);
        for bad in [
            json!([]),
            json!({"type": "x", "pattern": "a/*"}),
            json!({"type": "webhook", "webhook": {"url": "http://localhost/"}}),
            json!({"type": "webhook", "pattern": "a/*"}),
            json!({"type": "pull-wake", "pattern": "a/*"}),
            json!({"type": "pull-wake", "pattern": "a/*", "wake_stream": "w", "lease_ttl_ms": 10}),
            json!({"type": "pull-wake", "pattern": "a*", "wake_stream": "w"}),
            json!({"type": "pull-wake", "streams": ["a/../b"], "wake_stream": "w"}),
            json!({"type": "pull-wake", "streams": ["__ds/x"], "wake_stream": "w"}),
            json!({"type": "pull-wake", "streams": [1], "wake_stream": "w"}),
        ] {
            assert!(parse_config(&bad).is_err(), "{bad}");
        }
        let too_many: Vec<String> = (0..=MAX_STREAMS_PER_SUBSCRIPTION)
            .map(|i| format!("s{i}"))
            .collect();
        let err =
            parse_config(&json!({"type": "pull-wake", "streams": too_many, "wake_stream": "w"}))
                .unwrap_err();
        assert_eq!(err.code, "LIMIT_EXCEEDED");
    }

    #[test]
    fn create_confirms_identical_and_rejects_different_config() {
        let mut reg = registry();
        let clock = Clock::now();
        assert_eq!(
            reg.create("s", ROOT, BASE, webhook(1000), vec![], clock),
            Ok(true)
        );
        assert_eq!(
            reg.create("s", ROOT, BASE, webhook(1000), vec![], clock),
            Ok(false)
        );
        let err = reg
            .create("s", ROOT, BASE, webhook(2000), vec![], clock)
            .unwrap_err();
        assert_eq!((err.status, err.code), (409, "SUBSCRIPTION_ALREADY_EXISTS"));
        let described = reg.describe("s", "ds_k", "http://x/jwks").unwrap();
        assert_eq!(described["id"], "s");
        assert_eq!(described["type"], "webhook");
        assert_eq!(described["webhook"]["signing"]["kid"], "ds_k");
        assert!(described.get("webhook_secret").is_none());
        assert!(described.get("wake_stream").is_none());
    }

    #[test]
    fn subscription_count_is_bounded() {
        let mut reg = registry();
        let clock = Clock::now();
        for i in 0..MAX_SUBSCRIPTIONS {
            reg.create(&format!("s{i}"), ROOT, BASE, webhook(1000), vec![], clock)
                .unwrap();
        }
        let err = reg
            .create("one-more", ROOT, BASE, webhook(1000), vec![], clock)
            .unwrap_err();
        assert_eq!((err.status, err.code), (429, "LIMIT_EXCEEDED"));
    }

    #[test]
    fn webhook_done_reply_acks_the_snapshot() {
        let mut reg = registry();
        let clock = Clock::now();
        reg.create("s", ROOT, BASE, webhook(1000), vec![], clock)
            .unwrap();
        assert!(!reg.interested("/v1/stream/other/x"));
        assert!(!reg.interested("/v1/stream/__ds/x"));
        assert!(reg.interested("/v1/stream/events/x"));
        let effects = reg.on_write("/v1/stream/events/x", &offset(1), clock);
        let (job, body) = job_of(&effects);
        assert_eq!(body["subscription_id"], "s");
        assert_eq!(body["generation"], 1);
        assert_eq!(
            body["callback_url"],
            "http://127.0.0.1:4437/v1/stream/__ds/subscriptions/s/callback"
        );
        assert_eq!(body["streams"][0]["path"], "events/x");
        assert_eq!(body["streams"][0]["tail_offset"], offset(1));
        assert_eq!(body["streams"][0]["has_pending"], true);
        // A second write while the wake is out starts nothing new.
        assert!(reg
            .on_write("/v1/stream/events/x", &offset(2), clock)
            .is_empty());
        // `done` acks what the wake announced; the second write is still pending, so the next
        // wake goes out at once.
        let effects = reg.delivery_result(&job, Outcome::Done, clock);
        let (next, body) = job_of(&effects);
        assert_eq!(next.generation, 2);
        assert_eq!(body["streams"][0]["acked_offset"], offset(1));
        assert_eq!(body["streams"][0]["tail_offset"], offset(2));
        // The late result of the first wake changes nothing.
        assert!(reg.delivery_result(&job, Outcome::Done, clock).is_empty());
        assert!(reg.delivery_result(&next, Outcome::Done, clock).is_empty());
        let described = reg.describe("s", "k", "u").unwrap();
        assert_eq!(described["streams"][0]["acked_offset"], offset(2));
        assert_eq!(described["streams"][0]["link_type"], "glob");
        assert_eq!(described["status"], "active");
    }

    fn token_of(body: &Value, field: &str) -> String {
        body[field].as_str().unwrap().to_string()
    }

    #[test]
    fn callback_acks_then_fences_the_finished_generation() {
        let mut reg = registry();
        let clock = Clock::now();
        reg.create("s", ROOT, BASE, webhook(1000), vec![], clock)
            .unwrap();
        let (job, body) = job_of(&reg.on_write("/v1/stream/events/x", &offset(1), clock));
        assert!(reg
            .delivery_result(&job, Outcome::Accepted, clock)
            .is_empty());
        let token = token_of(&body, "callback_token");
        let done = ack_request(&body, "events/x", &offset(1), true);
        let mut effects = Vec::new();
        let settle = |reg: &mut Registry, req: &AckRequest, token: &str, fx: &mut Vec<Effect>| {
            reg.settle("s", Kind::Webhook, token, req, clock, fx)
        };
        // Bad acks are refused as a whole and leave the wake open.
        for (path, off) in [
            ("events/y", offset(1)),
            ("events/x", offset(2)),
            ("events/x", "-1".into()),
        ] {
            let req = ack_request(&body, path, &off, true);
            let err = settle(&mut reg, &req, &token, &mut effects).unwrap_err();
            assert_eq!(
                (err.status, err.code),
                (409, "INVALID_OFFSET"),
                "{path} {off}"
            );
        }
        let err = settle(&mut reg, &done, "garbage", &mut effects).unwrap_err();
        assert_eq!((err.status, err.code), (401, "TOKEN_INVALID"));
        let mut wrong_wake = done.clone();
        wrong_wake.wake_id = Some("w_other".into());
        assert_eq!(
            settle(&mut reg, &wrong_wake, &token, &mut effects)
                .unwrap_err()
                .code,
            "FENCED"
        );
        assert_eq!(settle(&mut reg, &done, &token, &mut effects), Ok(false));
        assert!(effects.is_empty());
        let err = settle(&mut reg, &done, &token, &mut effects).unwrap_err();
        assert_eq!((err.status, err.code), (409, "FENCED"));
        // The next wake's token is not the old one, and the old token cannot settle it.
        let (_, body2) = job_of(&reg.on_write("/v1/stream/events/x", &offset(2), clock));
        assert_eq!(body2["generation"], 2);
        let stale = ack_request(&body2, "events/x", &offset(2), true);
        assert_eq!(
            settle(&mut reg, &stale, &token, &mut effects)
                .unwrap_err()
                .code,
            "FENCED"
        );
        let fresh = token_of(&body2, "callback_token");
        assert_eq!(settle(&mut reg, &stale, &fresh, &mut effects), Ok(false));
        // A recreated subscription of the same id rejects its predecessor's tokens.
        reg.delete("s");
        reg.create("s", ROOT, BASE, webhook(1000), vec![], clock)
            .unwrap();
        let err = settle(&mut reg, &stale, &fresh, &mut effects).unwrap_err();
        assert_eq!(err.code, "TOKEN_INVALID");
    }

    #[test]
    fn acks_may_reach_tails_refreshed_from_the_engine() {
        let mut reg = registry();
        let clock = Clock::now();
        reg.create("s", ROOT, BASE, webhook(1000), vec![], clock)
            .unwrap();
        let (_, body) = job_of(&reg.on_write("/v1/stream/events/x", &offset(1), clock));
        let token = token_of(&body, "callback_token");
        let ack = ack_request(&body, "events/x", &offset(3), false);
        let mut fx = Vec::new();
        let err = reg
            .settle("s", Kind::Webhook, &token, &ack, clock, &mut fx)
            .unwrap_err();
        assert_eq!(err.code, "INVALID_OFFSET");
        // Tails never move back.
        reg.refresh_tails("s", &[("events/x".into(), offset(3))]);
        reg.refresh_tails("s", &[("events/x".into(), offset(2))]);
        assert_eq!(
            reg.settle("s", Kind::Webhook, &token, &ack, clock, &mut fx),
            Ok(false)
        );
        let regress = ack_request(&body, "events/x", &offset(2), false);
        let err = reg
            .settle("s", Kind::Webhook, &token, &regress, clock, &mut fx)
            .unwrap_err();
        assert_eq!(err.code, "INVALID_OFFSET");
    }

    #[test]
    fn webhook_lease_expiry_redelivers_with_a_new_generation() {
        let mut reg = registry();
        let t0 = Clock::now();
        reg.create("s", ROOT, BASE, webhook(1000), vec![], t0)
            .unwrap();
        let (job, body) = job_of(&reg.on_write("/v1/stream/events/x", &offset(1), t0));
        reg.delivery_result(&job, Outcome::Accepted, t0);
        assert!(reg.tick(t0).is_empty());
        let later = Clock {
            now: t0.now + Duration::from_millis(1001),
            ..t0
        };
        let (next, _) = job_of(&reg.tick(later));
        assert_eq!(next.generation, 2);
        let req = ack_request(&body, "events/x", &offset(1), true);
        let err = reg
            .settle(
                "s",
                Kind::Webhook,
                &token_of(&body, "callback_token"),
                &req,
                later,
                &mut Vec::new(),
            )
            .unwrap_err();
        assert_eq!(err.code, "FENCED");
    }

    #[test]
    fn failed_deliveries_back_off_then_give_up() {
        let mut reg = registry();
        let mut clock = Clock::now();
        reg.create("s", ROOT, BASE, webhook(1000), vec![], clock)
            .unwrap();
        let (mut job, _) = job_of(&reg.on_write("/v1/stream/events/x", &offset(1), clock));
        for attempt in 1..MAX_DELIVERY_ATTEMPTS {
            assert!(reg
                .delivery_result(&job, Outcome::Failed("refused".into()), clock)
                .is_empty());
            assert_eq!(reg.describe("s", "k", "u").unwrap()["status"], "failed");
            // Not before the backoff, then the same generation again.
            assert!(reg.tick(clock).is_empty());
            clock.now += retry_delay(attempt);
            let (retry, _) = job_of(&reg.tick(clock));
            assert_eq!(retry.generation, 1);
            job = retry;
        }
        assert!(reg
            .delivery_result(&job, Outcome::Failed("refused".into()), clock)
            .is_empty());
        clock.now += Duration::from_secs(3600);
        assert!(reg.tick(clock).is_empty());
        // The next write tries again, and success clears the failed status.
        let (job, _) = job_of(&reg.on_write("/v1/stream/events/x", &offset(2), clock));
        assert_eq!(job.generation, 2);
        reg.delivery_result(&job, Outcome::Accepted, clock);
        assert_eq!(reg.describe("s", "k", "u").unwrap()["status"], "active");
        assert_eq!(retry_delay(1), Duration::from_secs(1));
        assert_eq!(retry_delay(3), Duration::from_secs(4));
        assert_eq!(retry_delay(30), Duration::from_secs(60));
    }

    #[test]
    fn pull_wake_claim_ack_release() {
        let mut reg = registry();
        let clock = Clock::now();
        reg.create("p", ROOT, BASE, pull(1000), vec![], clock)
            .unwrap();
        let mut effects = Vec::new();
        let err = reg.claim("p", "w1", clock, &mut effects).unwrap_err();
        assert_eq!(err.code, "NO_PENDING_WORK");
        // The subscription's own wake stream never links (it would wake itself forever).
        assert!(!reg.interested("/v1/stream/wake/pool"));
        let effects = reg.on_write("/v1/stream/events/a", &offset(1), clock);
        let [Effect::AppendWake { stream, event }] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(stream, "/v1/stream/wake/pool");
        let event: Value = serde_json::from_str(event).unwrap();
        assert_eq!(
            (event["subscription_id"].as_str(), event["stream"].as_str()),
            (Some("p"), Some("events/a"))
        );
        let mut effects = Vec::new();
        let claimed = reg.claim("p", "w1", clock, &mut effects).unwrap();
        assert!(effects.is_empty());
        assert_eq!(claimed["generation"], 1);
        assert_eq!(claimed["streams"][0]["tail_offset"], offset(1));
        let busy = reg.claim("p", "w2", clock, &mut effects).unwrap_err();
        assert_eq!((busy.status, busy.code), (409, "ALREADY_CLAIMED"));
        assert_eq!(busy.to_json()["error"]["current_holder"], "w1");
        let token = token_of(&claimed, "token");
        let done = ack_request(&claimed, "events/a", &offset(1), true);
        let err = reg
            .settle("p", Kind::Webhook, &token, &done, clock, &mut effects)
            .unwrap_err();
        assert_eq!(err.status, 400);
        assert_eq!(
            reg.settle("p", Kind::PullWake, &token, &done, clock, &mut effects),
            Ok(false)
        );
        // A write, a claim and a release: the work is still pending, so a new wake is announced.
        assert_eq!(
            reg.on_write("/v1/stream/events/a", &offset(2), clock).len(),
            1
        );
        let claimed = reg.claim("p", "w1", clock, &mut effects).unwrap();
        assert_eq!(claimed["generation"], 2);
        let release = ack_request(&claimed, "events/a", &offset(2), false);
        let mut effects = Vec::new();
        reg.release(
            "p",
            &token_of(&claimed, "token"),
            &release,
            clock,
            &mut effects,
        )
        .unwrap();
        assert!(matches!(effects.as_slice(), [Effect::AppendWake { .. }]));
        let err = reg
            .release(
                "p",
                &token_of(&claimed, "token"),
                &release,
                clock,
                &mut effects,
            )
            .unwrap_err();
        assert_eq!(err.code, "FENCED");
    }

    #[test]
    fn pull_wake_lease_expiry_frees_the_claim() {
        let mut reg = registry();
        let t0 = Clock::now();
        reg.create("p", ROOT, BASE, pull(1000), vec![], t0).unwrap();
        reg.on_write("/v1/stream/events/a", &offset(1), t0);
        let mut effects = Vec::new();
        let claimed = reg.claim("p", "w1", t0, &mut effects).unwrap();
        let later = Clock {
            now: t0.now + Duration::from_millis(1500),
            ..t0
        };
        // The claim checks the lease itself, before any sweep.
        let claimed2 = reg.claim("p", "w2", later, &mut effects).unwrap();
        assert_eq!(claimed2["generation"], 2);
        assert!(matches!(effects.as_slice(), [Effect::AppendWake { .. }]));
        let ack = ack_request(&claimed, "events/a", &offset(1), true);
        let err = reg
            .settle(
                "p",
                Kind::PullWake,
                &token_of(&claimed, "token"),
                &ack,
                later,
                &mut effects,
            )
            .unwrap_err();
        assert_eq!(err.code, "FENCED");
    }

    #[test]
    fn restored_registry_fences_old_wakes_and_resumes_pending_work() {
        let rng = SystemRandom::new();
        let mut secret = [0u8; crate::ds_subs::keys::TOKEN_KEY_LEN];
        rng.fill(&mut secret).unwrap();
        let mut reg = Registry::new(TokenKey::from_secret(secret));
        let clock = Clock::now();
        reg.create("p", ROOT, BASE, pull(1000), vec![], clock)
            .unwrap();
        // Linked, nothing pending: not woken by the resume.
        let quiet = config(json!({"type": "pull-wake", "streams": ["quiet/x"],
            "wake_stream": "wake/quiet"}));
        let links = vec![("quiet/x".to_string(), LinkKind::Explicit, offset(4))];
        reg.create("quiet", ROOT, BASE, quiet, links, clock)
            .unwrap();
        let version = reg.version();
        reg.on_write("/v1/stream/events/a", &offset(1), clock);
        assert!(reg.version() > version, "a new link and a wake are durable");
        let mut effects = Vec::new();
        let claimed = reg.claim("p", "w1", clock, &mut effects).unwrap();
        let token = token_of(&claimed, "token");
        // A write while the wake is out moves only a tail: nothing to write.
        let version = reg.version();
        reg.on_write("/v1/stream/events/a", &offset(2), clock);
        assert_eq!(reg.version(), version);

        let mut restored =
            Registry::restore(&reg.snapshot(), TokenKey::from_secret(secret)).unwrap();
        assert!(restored.resume_pending());
        assert_eq!(restored.version(), 0);
        // The claim did not survive: its token is fenced, not invalid.
        let ack = ack_request(&claimed, "events/a", &offset(1), true);
        let err = restored
            .settle("p", Kind::PullWake, &token, &ack, clock, &mut effects)
            .unwrap_err();
        assert_eq!(err.code, "FENCED");
        // The tails read from the engine, then the pending work is announced again, once.
        restored.refresh_tails("p", &[("events/a".into(), offset(3))]);
        let effects = restored.resume(clock);
        let [Effect::AppendWake { stream, event }] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(stream, "/v1/stream/wake/pool");
        let event: Value = serde_json::from_str(event).unwrap();
        assert_eq!(
            (
                event["subscription_id"].as_str(),
                event["generation"].as_u64()
            ),
            (Some("p"), Some(2))
        );
        assert!(restored.resume(clock).is_empty());
        let mut effects = Vec::new();
        let claimed = restored.claim("p", "w1", clock, &mut effects).unwrap();
        assert_eq!(claimed["streams"][0]["tail_offset"], offset(3));
        assert_eq!(
            restored.describe("quiet", "k", "u").unwrap()["streams"][0]["acked_offset"],
            offset(4)
        );
        assert!(Registry::restore(&json!({}), TokenKey::from_secret(secret)).is_err());
    }

    #[test]
    fn explicit_streams_link_and_unlink() {
        let mut reg = registry();
        let clock = Clock::now();
        let c = config(json!({"type": "webhook", "streams": ["manual/a"],
            "webhook": {"url": "http://127.0.0.1:9/hook"}}));
        let links = vec![("manual/a".to_string(), LinkKind::Explicit, offset(5))];
        reg.create("s", ROOT, BASE, c, links, clock).unwrap();
        reg.add_explicit("s", vec![("manual/b".into(), ZERO_OFFSET.into())])
            .unwrap();
        let paths = |reg: &Registry| -> Vec<String> {
            reg.describe("s", "k", "u").unwrap()["streams"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["path"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(paths(&reg), ["manual/a", "manual/b"]);
        reg.remove_explicit("s", "manual/b").unwrap();
        reg.remove_explicit("s", "never/linked").unwrap();
        assert_eq!(paths(&reg), ["manual/a"]);
        assert_eq!(
            reg.describe("s", "k", "u").unwrap()["streams"][0]["link_type"],
            "explicit"
        );
        assert_eq!(
            reg.describe("s", "k", "u").unwrap()["streams"][0]["acked_offset"],
            offset(5)
        );
        // Writes to unlinked streams do nothing; to a linked one, they wake.
        assert!(!reg.interested("/v1/stream/manual/b"));
        assert!(reg
            .on_write("/v1/stream/manual/a", &offset(5), clock)
            .is_empty());
        assert_eq!(
            reg.on_write("/v1/stream/manual/a", &offset(6), clock).len(),
            1
        );
        assert_eq!(reg.add_explicit("nope", vec![]).unwrap_err().status, 404);
        let many: Vec<(String, String)> = (0..MAX_STREAMS_PER_SUBSCRIPTION)
            .map(|i| (format!("m/{i}"), ZERO_OFFSET.to_string()))
            .collect();
        assert_eq!(
            reg.add_explicit("s", many).unwrap_err().code,
            "LIMIT_EXCEEDED"
        );
        reg.on_delete("/v1/stream/manual/a");
        assert!(paths(&reg).is_empty());
    }
}
