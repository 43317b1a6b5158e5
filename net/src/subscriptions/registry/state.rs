//! The registry's state: each subscription with its linked streams (acked offset and last tail
//! seen) and its outstanding wake, and the effects and jobs transitions hand the caller.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use pico_meta::SeenStream;
use ring::rand::SystemRandom;
use serde_json::{json, Value};

use super::super::glob;
use super::super::keys::TokenError;
use super::super::keys::{Claims, TokenKey};
use super::request::{AckRequest, ApiError, Config};

/// The tail of an empty or missing stream.
pub const ZERO_OFFSET: &str = "0000000000000000_0000000000000000";
/// The acked offset of a stream linked by its first write: all of it is pending.
pub const BEFORE_FIRST_OFFSET: &str = "-1";

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

    pub(super) fn unix_secs(&self) -> u64 {
        (self.unix_ms.max(0) / 1000) as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Explicit,
    Glob,
}

/// A stream's tail as the engine answered it: its offset, and the id of the stream (the
/// incarnation of its name) it is the tail of; `None` when there is no stream by the name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamTail {
    pub offset: String,
    pub stream_id: Option<u64>,
}

impl StreamTail {
    /// The tail of a name no stream has now: the start.
    pub fn none() -> StreamTail {
        StreamTail {
            offset: ZERO_OFFSET.to_string(),
            stream_id: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Link {
    pub(super) explicit: bool,
    pub(super) glob: bool,
    pub(super) acked: String,
    pub(super) tail: String,
    /// The id of the stream `acked` and `tail` count in (`None`: not seen yet, or a state file
    /// of a build that did not keep it).
    pub(super) stream_id: Option<u64>,
}

/// What a tail the engine reported did to a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Observed {
    /// A tail of an earlier stream of the name than the link's: ignored.
    Stale,
    /// The link's own stream: its tail moved forward, if at all.
    Tail,
    /// The first stream the link saw: it counts in it from now on (worth writing to the state
    /// file).
    Identified,
    /// A later stream of the name (deleted, or expired, and created again): the link started
    /// over in it. A seen delete removes a link ([`Registry::on_delete`](super::Registry)), and
    /// the caller does the same with one that only an explicit request made.
    Restarted,
}

impl Link {
    /// A new link at `tail`: nothing before it is work.
    pub(super) fn at(tail: StreamTail) -> Link {
        Link {
            explicit: false,
            glob: false,
            acked: tail.offset.clone(),
            tail: tail.offset,
            stream_id: tail.stream_id,
        }
    }

    /// Takes a tail the engine reported ([`SeenStream`]): a tail of a later stream of the name
    /// than the link's starts the link over (nothing of that stream is acked: a node that did
    /// not see the delete, or a stream its reaper expired, must not start a worker where it
    /// stood in the old one), one of an earlier stream is stale, and tails of the link's own
    /// stream only move forward (writes on different cores may report out of order).
    pub(super) fn observe(&mut self, tail: &StreamTail) -> Observed {
        let observed = match SeenStream::compare(self.stream_id, tail.stream_id) {
            SeenStream::Earlier => return Observed::Stale,
            SeenStream::Later => {
                self.acked = BEFORE_FIRST_OFFSET.to_string();
                self.tail = ZERO_OFFSET.to_string();
                self.stream_id = tail.stream_id;
                Observed::Restarted
            }
            SeenStream::Same if self.stream_id.is_none() && tail.stream_id.is_some() => {
                self.stream_id = tail.stream_id;
                Observed::Identified
            }
            SeenStream::Same => Observed::Tail,
        };
        if tail.offset > self.tail {
            self.tail = tail.offset.clone();
        }
        observed
    }

    pub(super) fn pending(&self) -> bool {
        self.tail > self.acked
    }

    pub(super) fn link_type(&self) -> &'static str {
        if self.explicit {
            "explicit"
        } else {
            "glob"
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Delivery {
    /// Pull-wake: nothing is delivered.
    None,
    InFlight,
    RetryAt(Instant),
    Delivered,
}

#[derive(Debug)]
pub(super) struct Wake {
    pub(super) id: String,
    /// Pending streams and their tails when the wake started: what a synchronous `done`
    /// reply acknowledges.
    pub(super) snapshot: Vec<(String, String)>,
    /// The pull-wake worker holding the lease.
    pub(super) holder: Option<String>,
    /// Webhooks: from the start; pull-wake: from the claim.
    pub(super) lease_until: Option<Instant>,
    pub(super) delivery: Delivery,
}

#[derive(Debug)]
pub(super) struct Sub {
    pub(super) id: String,
    pub(super) incarnation: u64,
    /// The DS root (ends with `/`); stream names are `root + relative path`.
    pub(super) root: String,
    /// What the subscription counts against (`SUBSCRIPTIONS_PER_SCOPE_MAX`): the prefix of the
    /// admin grant that created it, or its root without auth.
    pub(super) scope: String,
    /// `base_url + root` of the creating request, for `callback_url`.
    pub(super) callback_base: String,
    pub(super) config: Config,
    pub(super) created_at: String,
    pub(super) failed: bool,
    pub(super) streams: BTreeMap<String, Link>,
    pub(super) generation: u64,
    pub(super) wake: Option<Wake>,
    pub(super) attempts: u32,
    pub(super) overflow_warned: bool,
}

impl Sub {
    /// The registry key (`root + id`).
    pub(super) fn key(&self) -> String {
        super::key(&self.root, &self.id)
    }

    pub(super) fn pending(&self) -> Option<&str> {
        self.streams
            .iter()
            .find(|(_, link)| link.pending())
            .map(|(path, _)| path.as_str())
    }

    pub(super) fn relative<'a>(&self, full_path: &'a str) -> Option<&'a str> {
        let rel = full_path.strip_prefix(self.root.as_str())?;
        (!rel.is_empty() && rel != "__ds" && !rel.starts_with("__ds/")).then_some(rel)
    }

    /// A new stream matching the pattern (never the subscription's own wake stream, whose
    /// events would wake it forever).
    pub(super) fn pattern_links(&self, rel: &str) -> bool {
        self.config
            .pattern
            .as_deref()
            .is_some_and(|p| glob::matches(p, rel))
            && self.config.wake_stream.as_deref() != Some(rel)
    }

    pub(super) fn stream_infos(&self) -> Vec<Value> {
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

    pub(super) fn lease(&self) -> Duration {
        Duration::from_millis(self.config.lease_ttl_ms)
    }

    pub(super) fn check_claims(&self, claims: &Claims) -> Result<(), ApiError> {
        if claims.subscription != self.id || claims.incarnation != self.incarnation {
            return Err(TokenError::Invalid.into());
        }
        Ok(())
    }

    pub(super) fn fence(&self, claims: &Claims, request: &AckRequest) -> Result<(), ApiError> {
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

/// A webhook POST for the delivery threads; the result comes back keyed by the generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The subscription's registry key (`root + id`).
    pub subscription: String,
    pub incarnation: u64,
    pub generation: u64,
    pub url: String,
    pub body: String,
    /// Who gets the result: the registry, or a caller of `Subscriptions::deliver_for`.
    pub origin: Origin,
}

/// Who a delivery's result goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The registry's own wake: the result moves its state machine.
    Registry,
    /// Another service's webhook (`Subscriptions::deliver_for`): the result is kept for it.
    Caller,
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

pub struct Registry {
    pub(super) subs: HashMap<String, Sub>,
    pub(super) tokens: TokenKey,
    pub(super) rng: SystemRandom,
    /// Goes up whenever state that the state file keeps changes (see `snapshot`); the store
    /// compares it with the version it last wrote.
    pub(super) version: u64,
    /// The subscriptions whose durable state changed since the store last took them.
    pub(super) changed: HashSet<String>,
    /// Restored from a file: the wakes that were outstanding are gone, so pending work is to be
    /// announced again (`resume`).
    pub(super) resume: bool,
}
