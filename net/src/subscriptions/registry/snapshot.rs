//! The registry's durable state as JSON: what the state file keeps (`snapshot`) and reads back
//! (`restore`), and the linked streams whose tails are refreshed after a restart.

use serde_json::{json, Value};
use std::collections::BTreeMap;

use super::super::keys::TokenKey;
use super::request::{normalize_path, parse_config, Config};
use super::state::{Link, Registry, Sub};
use crate::limits::{
    STREAMS_PER_SUBSCRIPTION_MAX, SUBSCRIPTIONS_PER_NODE_MAX, SUBSCRIPTION_ID_BYTES_MAX,
};

/// The durable state: what the state file keeps and `restore` reads back. Wakes (leases,
/// holders, in-flight and retried deliveries, their attempt counts) are left out: after a
/// restart they are simply gone, as if their leases had run out, and `resume` announces the
/// pending work again with a new generation.
impl Registry {
    /// The subscriptions as JSON (without the keys, which `store` adds), by root and id.
    #[cfg(test)]
    pub fn snapshot(&self) -> Value {
        let mut subs: Vec<&Sub> = self.subs.values().collect();
        subs.sort_by(|a, b| (&a.root, &a.id).cmp(&(&b.root, &b.id)));
        Value::Array(subs.into_iter().map(sub_json).collect())
    }

    /// One subscription as `snapshot` has it; `None` when there is none under `key`.
    pub fn snapshot_of(&self, key: &str) -> Option<Value> {
        self.subs.get(key).map(sub_json)
    }

    /// Marks every subscription changed (state read from a file of another format: the store
    /// writes all of it again).
    pub fn mark_all_changed(&mut self) {
        self.version += 1;
        self.changed.extend(self.subs.keys().cloned());
    }

    /// The registry `snapshot` wrote, with the token key of the same file. Anything missing or
    /// malformed is an error: a file this node did not write is not half-trusted.
    pub fn restore(snapshot: &Value, tokens: TokenKey) -> Result<Registry, SnapshotError> {
        let items = snapshot.as_array().ok_or(SnapshotError::NotAnArray)?;
        let labeled: Vec<(String, Value)> = items
            .iter()
            .enumerate()
            .map(|(index, item)| (format!("subscription {index}"), item.clone()))
            .collect();
        Registry::restore_labeled(&labeled, tokens)
    }

    /// [`Registry::restore`] of subscriptions given one by one, each with the label its errors
    /// start with (a file name).
    pub fn restore_labeled(
        items: &[(String, Value)],
        tokens: TokenKey,
    ) -> Result<Registry, SnapshotError> {
        if items.len() > SUBSCRIPTIONS_PER_NODE_MAX {
            return Err(SnapshotError::TooMany(items.len()));
        }
        let mut registry = Registry::new(tokens);
        for (label, item) in items {
            let sub = restore_sub(item).map_err(|error| SnapshotError::Subscription {
                label: label.clone(),
                error,
            })?;
            let key = sub.key();
            if registry.subs.contains_key(&key) {
                return Err(SnapshotError::DuplicateId {
                    label: label.clone(),
                    id: sub.id,
                });
            }
            registry.subs.insert(key, sub);
        }
        registry.resume = !registry.subs.is_empty();
        Ok(registry)
    }

    /// Whether `resume` is still to run.
    pub fn resume_pending(&self) -> bool {
        self.resume
    }

    /// Every linked stream per subscription, as (key, [(relative path, full name)]): for the
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
                (sub.key(), streams)
            })
            .collect()
    }
}

/// One subscription's durable state (wakes left out, see above).
fn sub_json(sub: &Sub) -> Value {
    let streams: Vec<Value> = sub
        .streams
        .iter()
        .map(|(path, link)| {
            let mut stream = json!({
                "path": path,
                "explicit": link.explicit,
                "glob": link.glob,
                "acked": link.acked,
                "tail": link.tail,
            });
            if let Some(id) = link.stream_id {
                stream["stream_id"] = id.into();
            }
            stream
        })
        .collect();
    json!({
        "id": sub.id,
        "incarnation": sub.incarnation,
        "root": sub.root,
        "scope": sub.scope,
        "callback_base": sub.callback_base,
        "created_at": sub.created_at,
        "config": config_body(&sub.config),
        "failed": sub.failed,
        "generation": sub.generation,
        "streams": streams,
    })
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

/// Why a snapshot (a state file's subscriptions) cannot be restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// A format-1 file's `subscriptions` is not an array.
    NotAnArray,
    /// More subscriptions than a node holds (their number).
    TooMany(usize),
    /// One subscription is malformed; `label` names it (its file, or its index).
    Subscription { label: String, error: FieldError },
    /// Two subscriptions of one root with the same id.
    DuplicateId { label: String, id: String },
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::NotAnArray => f.write_str("subscriptions is not an array"),
            SnapshotError::TooMany(count) => write!(
                f,
                "{count} subscriptions, more than the {SUBSCRIPTIONS_PER_NODE_MAX} a node holds"
            ),
            SnapshotError::Subscription { label, error } => write!(f, "{label}: {error}"),
            SnapshotError::DuplicateId { label, id } => {
                write!(f, "{label}: duplicate id {id:?}")
            }
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SnapshotError::Subscription { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// What is wrong in one subscription of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldError {
    NotAString(&'static str),
    NotAnUnsignedInteger(&'static str),
    NotABoolean(&'static str),
    /// An empty id, one too long or with a '/'.
    InvalidId(String),
    /// The configuration fails the checks of a `PUT` body (their message).
    Config(String),
    /// A root not ending with '/'.
    Root(String),
    StreamsNotAnArray,
    /// More linked streams than a subscription has (their number).
    TooManyStreams(usize),
    /// A linked stream's path fails the checks of a request's (their message).
    StreamPath(String),
    /// A stream linked neither explicitly nor by the pattern.
    Unlinked(String),
    DuplicateStream(String),
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldError::NotAString(field) => write!(f, "{field} is not a string"),
            FieldError::NotAnUnsignedInteger(field) => {
                write!(f, "{field} is not an unsigned integer")
            }
            FieldError::NotABoolean(field) => write!(f, "{field} is not a boolean"),
            FieldError::InvalidId(id) => write!(f, "invalid id {id:?}"),
            FieldError::Config(message) => write!(f, "config: {message}"),
            FieldError::Root(root) => write!(f, "root {root:?} does not end with '/'"),
            FieldError::StreamsNotAnArray => f.write_str("streams is not an array"),
            FieldError::TooManyStreams(count) => write!(f, "{count} linked streams"),
            FieldError::StreamPath(message) => write!(f, "stream path: {message}"),
            FieldError::Unlinked(path) => write!(
                f,
                "stream {path:?} is linked neither explicitly nor by pattern"
            ),
            FieldError::DuplicateStream(path) => write!(f, "stream {path:?} is listed twice"),
        }
    }
}

impl std::error::Error for FieldError {}

fn str_field<'a>(value: &'a Value, field: &'static str) -> Result<&'a str, FieldError> {
    value[field].as_str().ok_or(FieldError::NotAString(field))
}

fn u64_field(value: &Value, field: &'static str) -> Result<u64, FieldError> {
    value[field]
        .as_u64()
        .ok_or(FieldError::NotAnUnsignedInteger(field))
}

fn bool_field(value: &Value, field: &'static str) -> Result<bool, FieldError> {
    value[field].as_bool().ok_or(FieldError::NotABoolean(field))
}

fn restore_sub(item: &Value) -> Result<Sub, FieldError> {
    let id = str_field(item, "id")?;
    if id.is_empty() || id.len() > SUBSCRIPTION_ID_BYTES_MAX || id.contains('/') {
        return Err(FieldError::InvalidId(id.to_string()));
    }
    let config = parse_config(&item["config"]).map_err(|e| FieldError::Config(e.message))?;
    let root = str_field(item, "root")?;
    if !root.ends_with('/') {
        return Err(FieldError::Root(root.to_string()));
    }
    let items = item["streams"]
        .as_array()
        .ok_or(FieldError::StreamsNotAnArray)?;
    if items.len() > STREAMS_PER_SUBSCRIPTION_MAX {
        return Err(FieldError::TooManyStreams(items.len()));
    }
    let mut streams = BTreeMap::new();
    for stream in items {
        let path = normalize_path(str_field(stream, "path")?)
            .map_err(|e| FieldError::StreamPath(e.message))?;
        let link = Link {
            explicit: bool_field(stream, "explicit")?,
            glob: bool_field(stream, "glob")?,
            acked: str_field(stream, "acked")?.to_string(),
            tail: str_field(stream, "tail")?.to_string(),
            // Absent in files of builds before it was kept.
            stream_id: match &stream["stream_id"] {
                Value::Null => None,
                _ => Some(u64_field(stream, "stream_id")?),
            },
        };
        if !link.explicit && !link.glob {
            return Err(FieldError::Unlinked(path));
        }
        if streams.contains_key(&path) {
            return Err(FieldError::DuplicateStream(path));
        }
        streams.insert(path, link);
    }
    Ok(Sub {
        id: id.to_string(),
        incarnation: u64_field(item, "incarnation")?,
        // Files written before scopes count a subscription against its root.
        scope: item["scope"].as_str().unwrap_or(root).to_string(),
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
