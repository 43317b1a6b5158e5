//! The node's waker of named consumers: it knows the consumers that have a wake webhook, hears
//! every acknowledged write (a [`StreamWatcher`] of the subscriptions service), and starts a
//! wake (`wake::start`, one metadata transaction) when a write leaves one of a consumer's
//! streams past its committed offset while no lease runs. The POST runs on the subscriptions'
//! delivery threads, with their bounds, URL policy and signature; a delivery that fails
//! releases the lease it took and is tried again after a back-off.
//!
//! What it knows comes from the metadata log: every consumer with a wake, read at start and,
//! in a cluster, again every [`WAKE_RELOAD_INTERVAL`] (longer when the read is slow) so a node
//! hears of wakes set, acks and releases made through other nodes; changes made through this
//! node are applied at once (`observe`). Writes it did not hear of (before a restart, or before the first read) are
//! found by the ticker, which reads the tails of the streams it does not know and wakes the
//! consumers with work pending: a wake is never lost, at worst late by a reload.
//!
//! Costs: nothing on the write path while no consumer has a wake; otherwise one lock and a
//! map lookup per write, and a transaction per wake (not per write: a running lease, ours or a
//! reader's, makes later writes wake nobody).

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pico_engine::{CoreHandle, EngineError};

use super::rules::{self, Consumer, Outcome, Token};
use super::wake::{self, KnownTail, Start, Wake};
use crate::subscriptions::{DeliveryOutcome, StreamWatcher, Subscriptions};

/// How often the ticker takes delivery results and looks for consumers to wake.
const WAKE_TICK: Duration = Duration::from_millis(250);
/// How often the consumers with a wake are read again from the metadata log, at least; a read
/// that takes long spaces the next ones by [`WAKE_RELOAD_SLOWDOWN`] times its duration.
pub const WAKE_RELOAD_INTERVAL: Duration = Duration::from_secs(1);
const WAKE_RELOAD_SLOWDOWN: u32 = 20;
/// A node without a cluster hears of every change itself: it reads them again this seldom.
const WAKE_RELOAD_ALONE: Duration = Duration::from_secs(600);
/// The back-off after a failed delivery: doubling from the first, up to the last.
const WAKE_RETRY_FIRST: Duration = Duration::from_secs(1);
const WAKE_RETRY_MAX: Duration = Duration::from_secs(60);
/// Tails the ticker reads per tick (a node with many unknown streams learns them over ticks).
const TAIL_READS_PER_TICK: usize = 256;

/// Wake POSTs a receiver took (a 2xx answer), since start.
pub static WAKES_DELIVERED: AtomicU64 = AtomicU64::new(0);
/// Wake POSTs that failed or could not be queued (each gives its lease back), since start.
pub static WAKES_FAILED: AtomicU64 = AtomicU64::new(0);

/// `(scope, id)`.
type Key = (String, String);

/// The node's waker; a handle, cheap to clone.
#[derive(Clone, Default)]
pub struct ConsumerWakes {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Consumers with a wake known to this node, read without the lock on every write.
    active: AtomicUsize,
    ticker_running: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    consumers: HashMap<Key, Known>,
    by_stream: HashMap<String, Vec<Key>>,
    /// Tails of the followed streams this node serves, as its writes left them.
    tails: HashMap<String, KnownTail>,
    /// Followed streams another node serves (or none does), until the next reload.
    not_here: HashSet<String>,
    next_reload: Option<Instant>,
}

struct Known {
    wake: Wake,
    consumer: Consumer,
    /// The metadata log's clock when `consumer` was read, and this node's instant then: a
    /// lease is taken to run until `lease_expires_ms - read_ms` after `read_at`.
    read_ms: i64,
    read_at: Instant,
    attempt: Attempt,
    failures: u32,
    retry_at: Option<Instant>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Attempt {
    Idle,
    /// The transaction of `wake::start` runs.
    Starting,
    /// The POST of epoch `epoch` is queued or in flight since `since`; `token` releases it if
    /// it fails.
    Delivering {
        epoch: u64,
        token: String,
        since: Instant,
    },
}

impl Known {
    fn new(wake: Wake, consumer: Consumer, read_ms: i64) -> Known {
        Known {
            wake,
            consumer,
            read_ms,
            read_at: Instant::now(),
            attempt: Attempt::Idle,
            failures: 0,
            retry_at: None,
        }
    }

    fn lease_runs(&self, now: Instant) -> bool {
        let Some(holder) = &self.consumer.holder else {
            return false;
        };
        let left_ms = holder.lease_expires_ms.saturating_sub(self.read_ms);
        let elapsed_ms =
            i64::try_from(now.duration_since(self.read_at).as_millis()).unwrap_or(i64::MAX);
        left_ms > elapsed_ms
    }

    /// Whether a wake may start now (the transaction decides whether it does). A POST whose
    /// result never came (its report was dropped, or it waited in the queue) is given up once
    /// the lease it took would have lapsed: its token is of no use by then.
    fn may_start(&self, now: Instant) -> bool {
        let settled = match &self.attempt {
            Attempt::Idle => true,
            Attempt::Starting => false,
            Attempt::Delivering { since, .. } => {
                now.duration_since(*since) > Duration::from_millis(self.consumer.lease_ttl_ms)
            }
        };
        settled && self.retry_at.is_none_or(|at| at <= now) && !self.lease_runs(now)
    }

    fn refresh(&mut self, consumer: Consumer, read_ms: i64) {
        self.consumer = consumer;
        self.read_ms = read_ms;
        self.read_at = Instant::now();
    }
}

impl State {
    fn index(&mut self) {
        self.by_stream.clear();
        for (key, known) in &self.consumers {
            for cursor in &known.consumer.streams {
                self.by_stream
                    .entry(cursor.path.clone())
                    .or_default()
                    .push(key.clone());
            }
        }
        let followed = &self.by_stream;
        self.tails.retain(|path, _| followed.contains_key(path));
    }

    /// Of `keys`, the consumers a wake may start for now, with work pending on a stream whose
    /// tail this node knows: marked `Starting`.
    fn take_due(&mut self, keys: Vec<Key>, now: Instant) -> Vec<Key> {
        let mut due = Vec::new();
        for key in keys {
            let Some(known) = self.consumers.get(&key) else {
                continue;
            };
            let pending = wake::pending_stream(&known.consumer, &self.tails_of(&known.consumer));
            if pending.is_some() && known.may_start(now) {
                if let Some(known) = self.consumers.get_mut(&key) {
                    known.attempt = Attempt::Starting;
                }
                due.push(key);
            }
        }
        due
    }

    /// The tails this node knows of `consumer`'s streams.
    fn tails_of(&self, consumer: &Consumer) -> Vec<(String, KnownTail)> {
        consumer
            .streams
            .iter()
            .filter_map(|c| Some((c.path.clone(), *self.tails.get(&c.path)?)))
            .collect()
    }
}

fn delivery_key(key: &Key) -> String {
    // Subscriptions' own keys start with '/'; these never do.
    format!("consumer:{}\n{}", key.0, key.1)
}

fn retry_delay(failures: u32) -> Duration {
    WAKE_RETRY_FIRST
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(WAKE_RETRY_MAX)
}

impl ConsumerWakes {
    pub fn new() -> ConsumerWakes {
        ConsumerWakes::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The number of consumers with a wake this node knows of.
    pub fn len(&self) -> usize {
        self.inner.active.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set_active(&self, state: &State) {
        self.inner
            .active
            .store(state.consumers.len(), Ordering::Release);
    }

    /// What a consumer request through this node left: the consumer as it now is (`None`
    /// once deleted) and its wake.
    pub(super) fn observe(&self, scope: &str, id: &str, outcome: &Outcome) {
        let key = (scope.to_string(), id.to_string());
        let wake = outcome.wake.as_deref().and_then(Wake::parse);
        let mut state = self.lock();
        match (outcome.consumer.as_ref(), wake) {
            (Some(consumer), Some(wake)) if !consumer.group => {
                if let Some(known) = state.consumers.get_mut(&key) {
                    // A consumer's streams are fixed at registration: the index stands.
                    known.wake = wake;
                    known.refresh(consumer.clone(), outcome.now_ms);
                    return;
                }
                let known = Known::new(wake, consumer.clone(), outcome.now_ms);
                state.consumers.insert(key, known);
            }
            _ => {
                if state.consumers.remove(&key).is_none() {
                    return;
                }
            }
        }
        state.index();
        self.set_active(&state);
    }

    /// Starts the wakes `write` makes due: `path`'s tail is now `tail`.
    fn on_write(
        &self,
        hooks: &Arc<Subscriptions>,
        core: &Rc<CoreHandle>,
        path: &str,
        tail: KnownTail,
    ) {
        let due = {
            let mut state = self.lock();
            let Some(keys) = state.by_stream.get(path).cloned() else {
                return;
            };
            state.tails.insert(path.to_string(), tail);
            state.take_due(keys, Instant::now())
        };
        self.start_all(hooks, core, due);
    }

    fn start_all(&self, hooks: &Arc<Subscriptions>, core: &Rc<CoreHandle>, keys: Vec<Key>) {
        for key in keys {
            let (this, hooks, core) = (self.clone(), hooks.clone(), core.clone());
            glommio::spawn_local(async move { this.start(&hooks, &core, key).await }).detach();
        }
    }

    /// Runs the transaction that wakes consumer `key` (marked `Starting`), then queues its POST.
    async fn start(&self, hooks: &Arc<Subscriptions>, core: &Rc<CoreHandle>, key: Key) {
        let tails = {
            let state = self.lock();
            match state.consumers.get(&key) {
                Some(known) => state.tails_of(&known.consumer),
                None => return,
            }
        };
        let token = match Token::random() {
            Ok(token) => token,
            Err(e) => {
                log::error!("consumer wake: {}", e.message);
                self.failed(&key, None);
                return;
            }
        };
        let id = key.1.clone();
        let decided = core
            .meta()
            .change_consumer_following(key.0.clone(), key.1.clone(), rules::followed, move |read| {
                let now_ms = read.now_ms;
                let (write, start) = wake::start(read, &id, &tails, &token);
                let token = match &start {
                    Start::Woken { epoch, .. } => Some(token.text_for(*epoch)),
                    _ => None,
                };
                (write, (start, token, now_ms))
            })
            .await;
        let (start, token, now_ms) = match decided {
            Ok(Ok(decided)) => decided,
            Ok(Err(e)) => {
                log::warn!("consumer wake of {}: metadata log: {e}", key.1);
                self.failed(&key, None);
                return;
            }
            Err(_) => return,
        };
        let token = token.unwrap_or_default();
        // What is left to do once the lock is given back: deliver, or give the lease back.
        let delivery = {
            let mut state = self.lock();
            match start {
                Start::Woken {
                    epoch,
                    body,
                    wake,
                    consumer,
                } => match state.consumers.get_mut(&key) {
                    Some(known) => {
                        known.refresh(consumer, now_ms);
                        known.attempt = Attempt::Delivering {
                            epoch,
                            token: token.clone(),
                            since: Instant::now(),
                        };
                        Some(Some((epoch, wake.url, body)))
                    }
                    // Its wake was removed meanwhile: nobody is told, so nobody may hold it.
                    None => Some(None),
                },
                Start::Held(consumer) | Start::Idle(consumer) => {
                    if let Some(known) = state.consumers.get_mut(&key) {
                        known.refresh(consumer, now_ms);
                        known.attempt = Attempt::Idle;
                    }
                    None
                }
                Start::Gone => {
                    state.consumers.remove(&key);
                    state.index();
                    self.set_active(&state);
                    None
                }
            }
        };
        match delivery {
            Some(Some((epoch, url, body))) => {
                if let Err(reason) = hooks.deliver_for(delivery_key(&key), epoch, url, body) {
                    log::warn!("consumer wake of {}: {reason}", key.1);
                    self.release(core, key, token).await;
                }
            }
            Some(None) => self.release(core, key, token).await,
            None => {}
        }
    }

    /// A wake attempt failed: back off (and forget `token`, released by the caller).
    fn failed(&self, key: &Key, consumer: Option<(Consumer, i64)>) {
        let mut state = self.lock();
        if let Some(known) = state.consumers.get_mut(key) {
            known.attempt = Attempt::Idle;
            known.failures = known.failures.saturating_add(1);
            known.retry_at = Some(Instant::now() + retry_delay(known.failures));
            if let Some((consumer, read_ms)) = consumer {
                known.refresh(consumer, read_ms);
            }
        }
    }

    /// Gives up the lease a failed delivery took, so the consumer is not `READING` for nobody,
    /// and backs off.
    async fn release(&self, core: &Rc<CoreHandle>, key: Key, token: String) {
        WAKES_FAILED.fetch_add(1, Ordering::Relaxed);
        let released = core
            .meta()
            .change_consumer_following(key.0.clone(), key.1.clone(), rules::followed, move |read| {
                let (write, answer) = rules::release(read, &token);
                (
                    write,
                    answer.ok().and_then(|o| Some((o.consumer?, o.now_ms))),
                )
            })
            .await;
        // A superseded or lapsed lease is not ours to release any more: nothing to undo.
        let consumer = released.ok().and_then(Result::ok).flatten();
        self.failed(&key, consumer);
    }

    /// Takes the results of the POSTs.
    async fn take_reports(&self, hooks: &Arc<Subscriptions>, core: &Rc<CoreHandle>) {
        for report in hooks.take_reports() {
            let found = {
                let mut state = self.lock();
                state.consumers.iter_mut().find_map(|(key, known)| {
                    let Attempt::Delivering { epoch, token, .. } = &known.attempt else {
                        return None;
                    };
                    if *epoch != report.generation || delivery_key(key) != report.key {
                        return None;
                    }
                    let token = token.clone();
                    match &report.outcome {
                        DeliveryOutcome::Done | DeliveryOutcome::Accepted => {
                            WAKES_DELIVERED.fetch_add(1, Ordering::Relaxed);
                            known.attempt = Attempt::Idle;
                            known.failures = 0;
                            known.retry_at = None;
                            None
                        }
                        DeliveryOutcome::Failed(reason) => {
                            log::warn!("consumer wake of {} failed: {reason}", key.1);
                            Some((key.clone(), token))
                        }
                    }
                })
            };
            if let Some((key, token)) = found {
                self.release(core, key, token).await;
            }
        }
    }

    /// Reads every consumer with a wake from the metadata log when a reload is due.
    async fn reload(&self, core: &Rc<CoreHandle>) {
        let now = Instant::now();
        if self.lock().next_reload.is_some_and(|at| at > now) {
            return;
        }
        let list = match core.meta().waking_consumers().await {
            Ok(Ok(list)) => list,
            Ok(Err(e)) => {
                log::warn!("consumer wakes: cannot read them from the metadata log: {e}");
                self.lock().next_reload = Some(now + WAKE_RELOAD_INTERVAL);
                return;
            }
            Err(_) => return,
        };
        let took = now.elapsed();
        let mut state = self.lock();
        let mut seen = HashSet::with_capacity(list.consumers.len());
        for stored in list.consumers {
            let Some(wake) = stored.wake.as_deref().and_then(Wake::parse) else {
                continue;
            };
            let Ok(consumer) = Consumer::parse(&stored.document) else {
                continue;
            };
            if consumer.group {
                continue;
            }
            let key = (stored.scope, stored.id);
            seen.insert(key.clone());
            match state.consumers.get_mut(&key) {
                // A wake being started knows better than a read that began before it.
                Some(known) if known.attempt == Attempt::Starting => {}
                Some(known) => {
                    known.wake = wake;
                    known.refresh(consumer, list.now_ms);
                }
                None => {
                    state
                        .consumers
                        .insert(key, Known::new(wake, consumer, list.now_ms));
                }
            }
        }
        state.consumers.retain(|key, _| seen.contains(key));
        state.index();
        state.not_here.clear();
        // A single node changes its consumers only through itself (`observe`); its reloads are
        // a safety net.
        let every = match core.cluster() {
            Some(_) => WAKE_RELOAD_INTERVAL.max(took * WAKE_RELOAD_SLOWDOWN),
            None => WAKE_RELOAD_ALONE,
        };
        state.next_reload = Some(Instant::now() + every);
        self.set_active(&state);
    }

    /// Learns the tails of followed streams this node has not heard a write of (after a
    /// restart, or writes before the first reload), a bounded number per tick.
    async fn learn_tails(&self, core: &Rc<CoreHandle>) {
        let unknown: Vec<String> = {
            let state = self.lock();
            state
                .by_stream
                .keys()
                .filter(|p| !state.tails.contains_key(*p) && !state.not_here.contains(*p))
                .take(TAIL_READS_PER_TICK)
                .cloned()
                .collect()
        };
        for path in unknown {
            let tail = match core.head(&path).await {
                Ok(info) => Some(KnownTail {
                    records: info.next_offset,
                    incarnation: Some(info.id),
                }),
                Err(EngineError::NotFound | EngineError::Gone) => Some(KnownTail {
                    records: 0,
                    incarnation: None,
                }),
                Err(_) => None,
            };
            let mut state = self.lock();
            match tail {
                // A write heard meanwhile knows better.
                Some(tail) => {
                    state.tails.entry(path).or_insert(tail);
                }
                None => {
                    state.not_here.insert(path);
                }
            }
        }
    }

    /// Wakes every consumer with work pending on the streams this node serves and no lease.
    fn start_due(&self, hooks: &Arc<Subscriptions>, core: &Rc<CoreHandle>) {
        let due = {
            let mut state = self.lock();
            let keys = state.consumers.keys().cloned().collect();
            state.take_due(keys, Instant::now())
        };
        self.start_all(hooks, core, due);
    }

    async fn tick(self, hooks: Arc<Subscriptions>, core: Rc<CoreHandle>) {
        loop {
            self.take_reports(&hooks, &core).await;
            self.reload(&core).await;
            if !self.is_empty() {
                self.learn_tails(&core).await;
                self.start_due(&hooks, &core);
            }
            glommio::timer::sleep(WAKE_TICK).await;
        }
    }
}

impl StreamWatcher for ConsumerWakes {
    fn on_stream_write(
        &self,
        hooks: &Arc<Subscriptions>,
        core: &Rc<CoreHandle>,
        full_path: &str,
        stream_id: u64,
        next_offset: u64,
    ) {
        if self.inner.active.load(Ordering::Acquire) == 0 {
            return;
        }
        let tail = KnownTail {
            records: next_offset,
            incarnation: Some(stream_id),
        };
        self.on_write(hooks, core, full_path, tail);
    }

    fn on_stream_deleted(&self, full_path: &str) {
        if self.inner.active.load(Ordering::Acquire) == 0 {
            return;
        }
        // A new stream of the same name starts over at 0, and what the consumers following it
        // had processed was the deleted stream's: a write to the new one is work for them.
        // (Their stored cursors begin anew at their next change, `rules::stored`.)
        let state = &mut *self.lock();
        state.tails.remove(full_path);
        for key in state.by_stream.get(full_path).into_iter().flatten() {
            if let Some(known) = state.consumers.get_mut(key) {
                for cursor in &mut known.consumer.streams {
                    if cursor.path == full_path {
                        cursor.next = None;
                    }
                }
            }
        }
    }

    /// The ticker runs on the first core that starts.
    fn start_on_core(&self, hooks: &Arc<Subscriptions>, core: &Rc<CoreHandle>) {
        if self.inner.ticker_running.swap(true, Ordering::SeqCst) {
            return;
        }
        let (this, hooks, core) = (self.clone(), hooks.clone(), core.clone());
        glommio::spawn_local(this.tick(hooks, core)).detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(lease_ttl_ms: u64) -> Known {
        let document = serde_json::json!({"format": 1, "streams": [{"path": "/s", "next": null}],
            "lease_ttl_ms": lease_ttl_ms, "epoch": 1, "holder": null, "created_ms": 0});
        let wake = Wake {
            kind: "webhook".into(),
            url: "http://127.0.0.1:9/".into(),
            callback: "cb".into(),
        };
        Known::new(wake, Consumer::parse(&document.to_string()).unwrap(), 0)
    }

    #[test]
    fn a_post_whose_result_never_comes_is_given_up_with_its_lease() {
        let mut known = known(100);
        let now = Instant::now();
        assert!(known.may_start(now));
        known.attempt = Attempt::Delivering {
            epoch: 2,
            token: "2.x".into(),
            since: now,
        };
        assert!(!known.may_start(now + Duration::from_millis(50)));
        assert!(known.may_start(now + Duration::from_millis(150)));
        known.attempt = Attempt::Starting;
        assert!(!known.may_start(now + Duration::from_secs(3600)));
        known.attempt = Attempt::Idle;
        known.retry_at = Some(now + Duration::from_secs(1));
        assert!(!known.may_start(now));
        assert!(known.may_start(now + Duration::from_secs(1)));
    }

    #[test]
    fn retries_back_off_to_a_ceiling() {
        assert_eq!(retry_delay(1), WAKE_RETRY_FIRST);
        assert_eq!(retry_delay(2), WAKE_RETRY_FIRST * 2);
        assert_eq!(retry_delay(4), WAKE_RETRY_FIRST * 8);
        assert_eq!(retry_delay(40), WAKE_RETRY_MAX);
    }
}
