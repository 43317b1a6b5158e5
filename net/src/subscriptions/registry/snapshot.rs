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
    pub fn restore(snapshot: &Value, tokens: TokenKey) -> Result<Registry, String> {
        let items = snapshot.as_array().ok_or("subscriptions is not an array")?;
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
    ) -> Result<Registry, String> {
        if items.len() > SUBSCRIPTIONS_PER_NODE_MAX {
            return Err(format!(
                "{} subscriptions, more than the {SUBSCRIPTIONS_PER_NODE_MAX} a node holds",
                items.len()
            ));
        }
        let mut registry = Registry::new(tokens);
        for (label, item) in items {
            let sub = restore_sub(item).map_err(|e| format!("{label}: {e}"))?;
            let key = sub.key();
            if registry.subs.contains_key(&key) {
                return Err(format!("{label}: duplicate id {:?}", sub.id));
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
    if id.is_empty() || id.len() > SUBSCRIPTION_ID_BYTES_MAX || id.contains('/') {
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
    if items.len() > STREAMS_PER_SUBSCRIPTION_MAX {
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
