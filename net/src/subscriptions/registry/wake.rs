//! Starting, delivering and ending wakes: the callback token of a generation, the webhook job
//! or pull-wake event that announces it, lease expiry, and the back-off between failed
//! deliveries.

use std::time::Duration;

use ring::rand::{SecureRandom, SystemRandom};
use serde_json::json;

use super::super::keys::{Claims, TokenKey, TOKEN_TTL_SECS};
use super::super::percent::encode_component;
use super::request::Kind;
use super::state::{Clock, Delivery, Effect, Job, Origin, Sub, Wake};

const RETRY_BASE_MS: u64 = 1_000;
const MAX_RETRY_DELAY_MS: u64 = 60_000;

/// What transitions need besides the subscription itself.
pub(super) struct Ctx<'a> {
    pub(super) tokens: &'a TokenKey,
    pub(super) rng: &'a SystemRandom,
    pub(super) clock: Clock,
    pub(super) effects: &'a mut Vec<Effect>,
    /// The registry's `version`: bumped when durable state changes.
    pub(super) version: &'a mut u64,
    /// The registry's changed subscriptions (see `Registry::take_changed`).
    pub(super) changed: &'a mut std::collections::HashSet<String>,
}

impl Ctx<'_> {
    /// `sub`'s durable state changed.
    pub(super) fn touch(&mut self, sub: &Sub) {
        self.touch_key(sub.key());
    }

    /// The durable state of the subscription with registry key `key` changed.
    pub(super) fn touch_key(&mut self, key: String) {
        *self.version += 1;
        self.changed.insert(key);
    }

    pub(super) fn token(&self, sub: &Sub) -> String {
        self.tokens.issue(&Claims {
            subscription: sub.id.clone(),
            incarnation: sub.incarnation,
            generation: sub.generation,
            expires_unix: self.clock.unix_secs() + TOKEN_TTL_SECS,
        })
    }

    pub(super) fn wake_id(&self) -> String {
        let mut bytes = [0u8; 12];
        // SystemRandom fails only if the OS random source does; a fixed id then costs
        // unpredictability, not correctness (wake ids are compared, tokens are MACed).
        let _ = self.rng.fill(&mut bytes);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("w_{hex}")
    }

    pub(super) fn webhook_job(&self, sub: &Sub) -> Option<Job> {
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
            subscription: sub.key(),
            incarnation: sub.incarnation,
            generation: sub.generation,
            url: sub.config.webhook_url.clone()?,
            body: body.to_string(),
            origin: Origin::Registry,
        })
    }

    fn start_wake(&mut self, sub: &mut Sub, triggered_by: &str) {
        sub.generation += 1;
        // Persisted lazily: a generation lost in a crash is handed out again, but never with
        // the same wake id, so a token of the lost wake stays fenced.
        self.touch(sub);
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

    pub(super) fn wake_if_pending(&mut self, sub: &mut Sub) -> bool {
        match sub.pending().map(str::to_string) {
            Some(first) => {
                self.start_wake(sub, &first);
                true
            }
            None => false,
        }
    }

    pub(super) fn end_wake(&mut self, sub: &mut Sub) -> bool {
        sub.wake = None;
        self.wake_if_pending(sub)
    }

    /// Ends a wake whose lease ran out (lazily on every access, and from the sweeper).
    pub(super) fn expire(&mut self, sub: &mut Sub) {
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

/// 1 s, 2 s, 4 s … capped at a minute.
pub(super) fn retry_delay(attempts: u32) -> Duration {
    let ms = RETRY_BASE_MS.saturating_mul(1u64 << attempts.saturating_sub(1).min(16));
    Duration::from_millis(ms.min(MAX_RETRY_DELAY_MS))
}
