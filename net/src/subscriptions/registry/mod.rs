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
//!
//! Subscriptions are keyed by `root + id` ([`key`]): a subscription belongs to the root it was
//! created under, and every call but `create` names it by that key, so a request can reach
//! only the subscriptions of its own root.
//!
//! Files: `request.rs` parses what a request says, `state.rs` holds the subscriptions, this
//! file runs the transitions (create, link, write, ack, claim, release, tick), `wake.rs` starts
//! and ends wakes, `snapshot.rs` writes and restores the durable part.

mod request;
mod snapshot;
mod state;
#[cfg(test)]
mod tests;
mod wake;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use ring::rand::{SecureRandom, SystemRandom};

use serde_json::{json, Value};

use super::keys::TokenKey;
use crate::limits::{
    DELIVERY_ATTEMPTS_MAX, STREAMS_PER_SUBSCRIPTION_MAX, SUBSCRIPTIONS_PER_NODE_MAX,
    SUBSCRIPTIONS_PER_SCOPE_MAX,
};
use request::{is_offset, limit_streams};
pub use request::{
    normalize_path, parse_ack_request, parse_config, parse_streams, AckRequest, ApiError, Config,
    Kind,
};
#[cfg(test)]
pub use snapshot::FieldError;
pub use snapshot::SnapshotError;
pub use state::{
    Clock, Effect, Job, LinkKind, Origin, Outcome, Registry, StreamTail, BEFORE_FIRST_OFFSET,
    ZERO_OFFSET,
};
use state::{Delivery, Link, Observed, Sub};
use wake::{retry_delay, Ctx};

/// The registry key of subscription `id` under `root` (which ends with '/'; ids have no '/', so
/// the key names one pair).
pub fn key(root: &str, id: &str) -> String {
    format!("{root}{id}")
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
                changed: &mut $self.changed,
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
            changed: HashSet::new(),
            resume: false,
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Records that the durable state of subscription `key` changed (or that it is gone).
    fn mark_changed(&mut self, key: &str) {
        self.version += 1;
        self.changed.insert(key.to_string());
    }

    /// The keys of the subscriptions changed (or deleted) since the last call: what the state
    /// store writes again.
    pub fn take_changed(&mut self) -> HashSet<String> {
        std::mem::take(&mut self.changed)
    }

    /// Gives back keys a failed write took: they are written with the next.
    pub fn keep_changed(&mut self, keys: HashSet<String>) {
        self.changed.extend(keys);
    }

    pub fn tokens(&self) -> &TokenKey {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.subs.len()
    }

    pub fn config(&self, key: &str) -> Option<&Config> {
        self.subs.get(key).map(|s| &s.config)
    }

    /// The delivery state of a subscription's wake (`None` without one), for tests.
    #[cfg(test)]
    pub fn wake_delivery(&self, key: &str) -> Option<String> {
        let wake = self.subs.get(key)?.wake.as_ref()?;
        Some(format!("{:?}", wake.delivery))
    }

    /// The root a subscription's stream names start with.
    pub fn root(&self, key: &str) -> Option<&str> {
        self.subs.get(key).map(|s| s.root.as_str())
    }

    /// Creates subscription `id` under `root` with its initial links (streams that already
    /// exist, acked at their current tails so only later writes are pending). `Ok(false)`: the
    /// same configuration already existed. A new one must fit the node's limit and its
    /// `scope`'s: at most [`SUBSCRIPTIONS_PER_SCOPE_MAX`] subscriptions were created in one
    /// scope (the prefix of the grant that allowed the request, or the root without auth), so
    /// one tenant's count never includes another's.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &mut self,
        id: &str,
        root: &str,
        scope: &str,
        callback_base: &str,
        config: Config,
        links: Vec<(String, LinkKind, StreamTail)>,
        clock: Clock,
    ) -> Result<bool, ApiError> {
        let key = key(root, id);
        if let Some(existing) = self.subs.get(&key) {
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
        if self.subs.len() >= SUBSCRIPTIONS_PER_NODE_MAX {
            return Err(ApiError::new(
                429,
                "LIMIT_EXCEEDED",
                format!("this node holds at most {SUBSCRIPTIONS_PER_NODE_MAX} subscriptions"),
            ));
        }
        let in_scope = self.subs.values().filter(|sub| sub.scope == scope).count();
        if in_scope >= SUBSCRIPTIONS_PER_SCOPE_MAX {
            return Err(ApiError::new(
                429,
                "LIMIT_EXCEEDED",
                format!("at most {SUBSCRIPTIONS_PER_SCOPE_MAX} subscriptions under {scope}"),
            ));
        }
        let mut streams: BTreeMap<String, Link> = BTreeMap::new();
        for (path, kind, tail) in links {
            let link = streams.entry(path).or_insert_with(|| Link::at(tail));
            match kind {
                LinkKind::Explicit => link.explicit = true,
                LinkKind::Glob => link.glob = true,
            }
        }
        if streams.len() > STREAMS_PER_SUBSCRIPTION_MAX {
            return Err(limit_streams());
        }
        let mut incarnation = [0u8; 8];
        let _ = self.rng.fill(&mut incarnation);
        self.mark_changed(&key);
        self.subs.insert(
            key,
            Sub {
                id: id.to_string(),
                incarnation: u64::from_le_bytes(incarnation),
                root: root.to_string(),
                scope: scope.to_string(),
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
        Ok(true)
    }

    /// The JSON of `GET …/subscriptions/:id` (no secrets: tokens are never listed).
    pub fn describe(&self, key: &str, kid: &str, jwks_url: &str) -> Option<Value> {
        let sub = self.subs.get(key)?;
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

    pub fn delete(&mut self, key: &str) -> bool {
        let removed = self.subs.remove(key).is_some();
        if removed {
            self.mark_changed(key);
        }
        removed
    }

    /// Links explicit streams, each with its current tail (an already linked stream keeps its
    /// acked offset).
    pub fn add_explicit(
        &mut self,
        key: &str,
        links: Vec<(String, StreamTail)>,
    ) -> Result<(), ApiError> {
        let sub = self.subs.get_mut(key).ok_or_else(ApiError::not_found)?;
        let new = links
            .iter()
            .map(|(path, _)| path)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|path| !sub.streams.contains_key(*path))
            .count();
        if sub.streams.len() + new > STREAMS_PER_SUBSCRIPTION_MAX {
            return Err(limit_streams());
        }
        for (path, tail) in links {
            sub.streams
                .entry(path)
                .or_insert_with(|| Link::at(tail))
                .explicit = true;
        }
        self.mark_changed(key);
        Ok(())
    }

    /// Unlinks an explicit stream (a pattern link of the same stream stays).
    pub fn remove_explicit(&mut self, key: &str, path: &str) -> Result<(), ApiError> {
        let sub = self.subs.get_mut(key).ok_or_else(ApiError::not_found)?;
        if let Some(link) = sub.streams.get_mut(path) {
            link.explicit = false;
            if !link.glob {
                sub.streams.remove(path);
            }
            self.mark_changed(key);
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
    pub fn on_write(&mut self, full_path: &str, tail: &StreamTail, clock: Clock) -> Vec<Effect> {
        let mut effects = Vec::new();
        let (subs, mut ctx) = ctx!(self, clock, &mut effects);
        for sub in subs.values_mut() {
            let Some(rel) = sub.relative(full_path) else {
                continue;
            };
            let by_pattern = sub.pattern_links(rel);
            if by_pattern && !sub.streams.contains_key(rel) {
                if sub.streams.len() >= STREAMS_PER_SUBSCRIPTION_MAX {
                    if !sub.overflow_warned {
                        sub.overflow_warned = true;
                        log::warn!(
                            "subscription {}: pattern matches more than {STREAMS_PER_SUBSCRIPTION_MAX} streams; {rel} and later ones are not linked",
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
                        stream_id: tail.stream_id,
                    },
                );
                ctx.touch(sub);
            }
            let Some(link) = sub.streams.get_mut(rel) else {
                continue;
            };
            if by_pattern && !link.glob {
                link.glob = true;
                ctx.touch_key(key(&sub.root, &sub.id));
            }
            match link.observe(tail) {
                Observed::Stale => continue,
                Observed::Restarted if !link.glob => {
                    sub.streams.remove(rel);
                    ctx.touch_key(key(&sub.root, &sub.id));
                    continue;
                }
                Observed::Restarted | Observed::Identified => {
                    ctx.touch_key(key(&sub.root, &sub.id))
                }
                Observed::Tail => {}
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
        for (key, sub) in self.subs.iter_mut() {
            if let Some(rel) = sub.relative(full_path) {
                if sub.streams.remove(rel).is_some() {
                    self.version += 1;
                    self.changed.insert(key.clone());
                }
            }
        }
    }

    /// Moves linked streams' tails forward to ones just read from the engine (before acks are
    /// checked against them: writes that bypassed the DS protocol were not reported).
    pub fn refresh_tails(&mut self, key: &str, tails: &[(String, StreamTail)]) {
        let Some(sub) = self.subs.get_mut(key) else {
            return;
        };
        let mut changed = false;
        for (path, tail) in tails {
            let Some(link) = sub.streams.get_mut(path) else {
                continue;
            };
            match link.observe(tail) {
                Observed::Stale | Observed::Tail => {}
                Observed::Restarted if !link.glob => {
                    sub.streams.remove(path);
                    changed = true;
                }
                Observed::Restarted | Observed::Identified => changed = true,
            }
        }
        if changed {
            self.mark_changed(key);
        }
    }

    /// A webhook callback (`kind` webhook) or a pull-wake ack: applies the acks, extends the
    /// lease, and with `done` ends the wake. Returns whether a next wake started.
    pub fn settle(
        &mut self,
        key: &str,
        kind: Kind,
        token: &str,
        request: &AckRequest,
        clock: Clock,
        effects: &mut Vec<Effect>,
    ) -> Result<bool, ApiError> {
        let claims = self.tokens.verify(token, clock.unix_secs());
        let (subs, mut ctx) = ctx!(self, clock, effects);
        let sub = subs.get_mut(key).ok_or_else(ApiError::not_found)?;
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
            ctx.touch(sub);
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
        key: &str,
        worker: &str,
        clock: Clock,
        effects: &mut Vec<Effect>,
    ) -> Result<Value, ApiError> {
        let (subs, mut ctx) = ctx!(self, clock, effects);
        let sub = subs.get_mut(key).ok_or_else(ApiError::not_found)?;
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
        key: &str,
        token: &str,
        request: &AckRequest,
        clock: Clock,
        effects: &mut Vec<Effect>,
    ) -> Result<(), ApiError> {
        let claims = self.tokens.verify(token, clock.unix_secs());
        let (subs, mut ctx) = ctx!(self, clock, effects);
        let sub = subs.get_mut(key).ok_or_else(ApiError::not_found)?;
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
                ctx.touch(sub);
                sub.failed = false;
                sub.attempts = 0;
                ctx.end_wake(sub);
            }
            Outcome::Accepted => {
                if sub.failed {
                    ctx.touch_key(job.subscription.clone());
                }
                sub.failed = false;
                sub.attempts = 0;
                wake.delivery = Delivery::Delivered;
                // The receiver has the wake from now on: it gets a whole lease to call back.
                wake.lease_until = Some(clock.now + lease);
            }
            Outcome::Failed(reason) => {
                if !sub.failed {
                    ctx.touch_key(job.subscription.clone());
                }
                sub.failed = true;
                sub.attempts += 1;
                if sub.attempts >= DELIVERY_ATTEMPTS_MAX {
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
