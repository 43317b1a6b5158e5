//! The Durable Streams reserved subscription APIs under `{root}__ds/`: webhook and pull-wake
//! subscriptions over stream patterns and explicit streams, their leases and generation
//! fencing, signed webhook deliveries and the JWKS that verifies them.
//!
//! State lives in memory behind one lock per node: this is the control plane (a few requests
//! per wake), not the data path, and writes take the lock only when some subscription links the
//! written stream.
//!
//! Persistence (`Subscriptions::open`; `new` keeps everything in memory): the subscriptions
//! (definitions, links, acked offsets, generations) and the node's keys are kept in one state
//! file in the node's directory, rewritten whole and atomically (see `store`) off the cores,
//! on a blocking thread. What a request changes is in the file before it is answered: creating,
//! re-confirming or deleting a subscription, linking or unlinking streams, acks (callbacks and
//! pull-wake acks). What a write or a timer changes (a pattern linking a new stream, a deleted
//! stream's link, a wake's generation, a delivery's failed status) is written by the sweeper
//! within `SWEEP_INTERVAL`, so the write path never waits for a disk; a crash may lose that
//! much, which costs at most a duplicate wake, never an ack. A synchronous `done` reply to a
//! webhook acks too; the delivery thread that got it writes it at once.
//!
//! Not persisted: wakes, i.e. leases, claims and in-flight or retried deliveries. They are lost
//! in a restart as if their leases had run out: tokens of those wakes are then `FENCED`, and
//! once restored the sweeper reads the linked streams' tails and starts a new wake, of a new
//! generation, for every subscription with pending work.
//!
//! Timers (lease expiry, delivery retries, the lagging writes) run in one sweeper task on the
//! core that created the first subscription (or, after a restart, the first core to start); it
//! stops when none is left. Webhook POSTs run on the `pico-webhooks-*` threads (see `delivery`).
//!
//! Tenancy: a subscription belongs to the root it was created under (`{root}__ds/…`). The
//! registry keys it by `root + id`, so the same id under two roots names two subscriptions, and
//! a request reaches only the subscriptions of its own root: one of another root answers `404`
//! like an unknown id. Creating one counts against the node
//! ([`SUBSCRIPTIONS_PER_NODE_MAX`](crate::limits::SUBSCRIPTIONS_PER_NODE_MAX)) and against the
//! scope of the request ([`SUBSCRIPTIONS_PER_SCOPE_MAX`](crate::limits::SUBSCRIPTIONS_PER_SCOPE_MAX)):
//! the prefix of the admin grant that allowed it, or the root without auth.
//!
//! Files: this one holds the node's `Subscriptions`, wakes them after writes and runs the
//! sweeper; `routes.rs` answers the control API; `registry/` is the state machine,
//! `shared.rs` what the cores and the delivery threads share, `store.rs` the state file,
//! `delivery.rs` the webhook threads, `response.rs` the parser of receivers' answers.

mod delivery;
mod glob;
mod keys;
pub(crate) mod percent;
mod queue;
mod registry;
mod response;
mod routes;
mod shared;
mod store;
#[cfg(test)]
mod tests;
mod webhook_url;

use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bytes::Bytes;
use pico_engine::{AppendRequest, CoreHandle, EngineError, RecordInput, WriteObserver};

use keys::{SigningKey, TokenKey};
use queue::Queue;
pub use registry::Outcome as DeliveryOutcome;
use registry::{ApiError, Clock, Effect, Job, Origin, Registry, StreamTail};

use shared::Shared;
use store::Store;
pub use store::{Action as StoreAction, StoreError};
pub use webhook_url::UrlError;

/// How often the sweeper looks for expired leases and due retries.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// The node's subscriptions; one per node, shared by all cores.
pub struct Subscriptions {
    shared: Arc<Shared>,
    /// Another service told of the same writes (named consumers' wake webhooks).
    watcher: OnceLock<Arc<dyn StreamWatcher>>,
}

/// A service that wants the writes and deletions the subscriptions see, and the delivery
/// threads for its own webhooks ([`Subscriptions::deliver_for`]).
pub trait StreamWatcher: Send + Sync {
    /// A write to `full_path` (the stream whose id is `stream_id`) was acknowledged;
    /// `next_offset` is the stream's new tail.
    fn on_stream_write(
        &self,
        hooks: &Arc<Subscriptions>,
        core: &Rc<CoreHandle>,
        full_path: &str,
        stream_id: u64,
        next_offset: u64,
    );
    /// `full_path` was deleted.
    fn on_stream_deleted(&self, full_path: &str);
    /// A core started (`Subscriptions::start_on_core`).
    fn start_on_core(&self, hooks: &Arc<Subscriptions>, core: &Rc<CoreHandle>);
}

/// One core's observer of the writes its engine handle acknowledged: they wake the
/// subscriptions and the [`StreamWatcher`].
struct CoreWrites {
    subscriptions: Arc<Subscriptions>,
    /// Weak: the handle holds this observer.
    core: std::rc::Weak<CoreHandle>,
}

impl WriteObserver for CoreWrites {
    fn on_write(&self, name: &str, stream_id: u64, next_offset: u64) {
        if let Some(core) = self.core.upgrade() {
            self.subscriptions
                .on_stream_write(&core, name, stream_id, next_offset);
        }
    }

    fn on_delete(&self, name: &str) {
        self.subscriptions.on_stream_deleted(name);
    }
}

/// How a delivery asked with [`Subscriptions::deliver_for`] went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryReport {
    pub key: String,
    pub generation: u64,
    pub outcome: DeliveryOutcome,
}

impl Drop for Subscriptions {
    /// Ends the delivery threads once their current deliveries are over.
    fn drop(&mut self) {
        self.shared.deliveries.close();
    }
}

impl Default for Subscriptions {
    fn default() -> Subscriptions {
        Subscriptions::new()
    }
}

fn offset_string(seq: u64) -> String {
    format!("{seq:016}_{:016}", 0)
}

/// The tail `next_offset` of the stream whose id is `stream_id`, its offset in DS form.
fn stream_tail(next_offset: u64, stream_id: u64) -> StreamTail {
    StreamTail {
        offset: offset_string(next_offset),
        stream_id: Some(stream_id),
    }
}

/// The current tail of a stream as a DS offset; a missing stream has the empty tail.
async fn tail_of(core: &CoreHandle, name: &str) -> Result<StreamTail, ApiError> {
    match core.head(name).await {
        Ok(info) => Ok(stream_tail(info.next_offset, info.id)),
        // A stream deleted while forks still read it (`Gone`) is gone for clients as much as one
        // never created: watched from the start, like a stream yet to be made.
        Err(EngineError::NotFound | EngineError::Gone) => Ok(StreamTail::none()),
        Err(e) => Err(engine_error(&e)),
    }
}

fn engine_error(e: &EngineError) -> ApiError {
    ApiError::new(503, "UNAVAILABLE", format!("stream engine: {e}"))
}

fn persist_error(message: StoreError) -> ApiError {
    log::error!("subscriptions: {message}");
    ApiError::new(
        503,
        "UNAVAILABLE",
        format!("the change is applied but may not survive a restart: {message}"),
    )
}

/// A new node's keys.
fn generate_keys() -> (SigningKey, TokenKey) {
    let rng = ring::rand::SystemRandom::new();
    // Only an OS without a working random source fails here; nothing can run without one.
    let signing = SigningKey::generate(&rng).expect("OS random source for the webhook key");
    let tokens = TokenKey::generate(&rng).expect("OS random source for the token key");
    (signing, tokens)
}

impl Subscriptions {
    /// In memory only (tests): fresh keys, and a restart forgets everything.
    pub fn new() -> Subscriptions {
        let (signing, tokens) = generate_keys();
        Subscriptions::start(signing, Registry::new(tokens), None)
    }

    /// One per node: the subscriptions and keys of the state file `dir/subscriptions.json`,
    /// or a fresh start with new keys when there is no such file (it is written with the
    /// first subscription). A file that cannot be read or parsed is an error naming it.
    pub fn open(dir: &Path) -> Result<Subscriptions, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            action: StoreAction::Create,
            path: dir.to_path_buf(),
            source,
        })?;
        let store = Store::new(dir);
        let (signing, registry) = match store.load()? {
            Some(loaded) => loaded,
            None => {
                let (signing, tokens) = generate_keys();
                (signing, Registry::new(tokens))
            }
        };
        Ok(Subscriptions::start(signing, registry, Some(store)))
    }

    /// The delivery threads start with the first delivery and end when this value is dropped.
    fn start(signing: SigningKey, registry: Registry, store: Option<Store>) -> Subscriptions {
        Subscriptions::start_with(signing, registry, store, delivery::deliver)
    }

    fn start_with(
        signing: SigningKey,
        registry: Registry,
        store: Option<Store>,
        deliver: shared::DeliverFn,
    ) -> Subscriptions {
        let shared = Arc::new(Shared {
            active: AtomicUsize::new(registry.len()),
            registry: RwLock::new(registry),
            signing,
            sweeper_running: AtomicBool::new(false),
            store,
            deliveries: Queue::new(),
            deliver,
            webhook_loopback: AtomicBool::new(true),
            own_listeners: RwLock::new(Vec::new()),
            reports: Mutex::new(Vec::new()),
        });
        Subscriptions {
            shared,
            watcher: OnceLock::new(),
        }
    }

    /// Tells `watcher` of every write and deletion from now on (once per node).
    pub fn set_watcher(&self, watcher: Arc<dyn StreamWatcher>) {
        if self.watcher.set(watcher).is_err() {
            log::error!("subscriptions: a second stream watcher is ignored");
        }
    }

    /// Queues a signed webhook POST of another service on the delivery threads (the same
    /// bounds, URL policy and signature as subscriptions' own). `key` names what it is for
    /// (it must not start with '/', which the subscriptions' own keys do): one delivery per key
    /// waits at a time, a newer one replacing it. The result comes back from
    /// [`take_reports`](Self::take_reports) with `key` and `generation`. `Err`: not queued.
    pub fn deliver_for(
        &self,
        key: String,
        generation: u64,
        url: String,
        body: String,
    ) -> Result<(), &'static str> {
        debug_assert!(!key.starts_with('/'), "{key}");
        let job = Job {
            subscription: key,
            incarnation: 0,
            generation,
            url,
            body,
            origin: Origin::Caller,
        };
        delivery::push(&self.shared, job).map_err(|(_, reason)| reason)
    }

    /// The results of [`deliver_for`](Self::deliver_for) deliveries since the last call.
    pub fn take_reports(&self) -> Vec<DeliveryReport> {
        std::mem::take(
            &mut *self
                .shared
                .reports
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// Checks `url` against the webhook URL policy (`webhook_url`) as a subscription's is
    /// checked when created; every delivery checks it again, resolved addresses included.
    pub fn check_webhook_url(&self, url: &str) -> Result<(), UrlError> {
        webhook_url::check(url, self.shared.webhook_loopback_allowed()).map(|_| ())
    }

    /// In memory, with `deliver` doing each delivery (tests of the delivery threads).
    #[cfg(test)]
    fn with_delivery(deliver: shared::DeliverFn) -> Subscriptions {
        let (signing, tokens) = generate_keys();
        Subscriptions::start_with(signing, Registry::new(tokens), None, deliver)
    }

    /// Whether webhooks may go to loopback hosts (`localhost`, 127.0.0.0/8, `::1`): checked when
    /// a subscription is created and again at every delivery. On unless turned off; the server
    /// turns it off when it listens beyond loopback without `--webhook-allow-loopback`.
    pub fn set_webhook_loopback(&self, allowed: bool) {
        self.shared
            .webhook_loopback
            .store(allowed, Ordering::Relaxed);
    }

    /// This node's listeners, as bound: deliveries never go to them.
    pub fn set_own_listeners(&self, listeners: Vec<std::net::SocketAddr>) {
        *self
            .shared
            .own_listeners
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = listeners;
    }

    /// The number of subscriptions.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// The state file, unless in memory.
    pub fn state_path(&self) -> Option<&Path> {
        self.shared.store.as_ref().map(Store::path)
    }

    /// Called by every core once it runs: with restored subscriptions, starts the sweeper
    /// (leases, retries, lagging writes) and through it the announcement of pending work.
    pub fn start_on_core(self: &Arc<Self>, core: &Rc<CoreHandle>) {
        core.observe_writes(Rc::new(CoreWrites {
            subscriptions: self.clone(),
            core: Rc::downgrade(core),
        }));
        if let Some(watcher) = self.watcher.get() {
            watcher.start_on_core(self, core);
        }
        if self.shared.active.load(Ordering::Acquire) > 0 {
            self.ensure_sweeper(core);
        }
    }

    /// Brings the state files up to date, then copies them into `dest` (a backup); the
    /// number of subscriptions copied (0 in memory). Blocks: call it off the cores.
    pub fn back_up_to(&self, dest: &Path) -> Result<usize, StoreError> {
        self.shared.persist()?;
        match &self.shared.store {
            Some(store) => store.copy_to(dest),
            None => Ok(0),
        }
    }

    /// Writes what the state file lags behind (at shutdown, once the cores stopped). Blocks.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.shared.persist()
    }

    /// Brings the state file up to date before a request is answered (on a blocking thread:
    /// the core goes on serving meanwhile).
    async fn persist(&self) -> Result<(), ApiError> {
        if !self.shared.dirty() {
            return Ok(());
        }
        let shared = self.shared.clone();
        glommio::executor()
            .spawn_blocking(move || shared.persist())
            .await
            .map_err(persist_error)
    }

    /// The one wake-up after a write, whichever protocol or service took it (the engine's
    /// [`WriteObserver`], `CoreWrites`): called with the stream
    /// `full_path` (whose id is `stream_id`) and the `next_offset` of the engine's
    /// acknowledgement (its new tail). Free
    /// when there are no subscriptions (the offset is formatted only for a linked stream);
    /// takes the write lock only when a subscription links the stream.
    pub fn on_stream_write(
        self: &Arc<Self>,
        core: &Rc<CoreHandle>,
        full_path: &str,
        stream_id: u64,
        next_offset: u64,
    ) {
        if let Some(watcher) = self.watcher.get() {
            watcher.on_stream_write(self, core, full_path, stream_id, next_offset);
        }
        if self.shared.active.load(Ordering::Acquire) == 0
            || !self.shared.read().interested(full_path)
        {
            return;
        }
        let tail = stream_tail(next_offset, stream_id);
        let effects = self.shared.write().on_write(full_path, &tail, Clock::now());
        self.run_effects(core, effects);
    }

    /// Called after a stream was deleted, so that a new stream of the same name is linked
    /// afresh (its offsets start over).
    pub fn on_stream_deleted(&self, full_path: &str) {
        if let Some(watcher) = self.watcher.get() {
            watcher.on_stream_deleted(full_path);
        }
        if self.shared.active.load(Ordering::Acquire) == 0 {
            return;
        }
        self.shared.write().on_delete(full_path);
    }

    fn run_effects(self: &Arc<Self>, core: &Rc<CoreHandle>, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Deliver(job) => self.enqueue(job),
                Effect::AppendWake { stream, event } => {
                    let (this, core) = (self.clone(), core.clone());
                    glommio::spawn_local(async move {
                        this.append_wake(&core, &stream, event).await;
                    })
                    .detach();
                }
            }
        }
    }

    fn enqueue(&self, job: Job) {
        delivery::enqueue(&self.shared, job);
    }

    /// Appends a pull-wake event (one JSON message) to the wake stream, then reports the write
    /// like any other (another subscription may watch the wake stream).
    async fn append_wake(self: &Arc<Self>, core: &Rc<CoreHandle>, stream: &str, event: String) {
        let append = AppendRequest {
            records: vec![RecordInput {
                headers: Vec::new(),
                body: Bytes::from(event),
            }],
            close: false,
            match_offset: None,
            producer: None,
            content_type: None,
            writer_seq: None,
            // The node wrote the event with serde_json: one JSON value.
            json_checked: true,
        };
        // Its acknowledgement reaches `on_stream_write` like any other (another subscription
        // may watch the wake stream).
        if let Err(e) = core.append(stream, append).await {
            log::warn!("cannot append a wake event to {stream}: {e}");
        }
    }

    fn ensure_sweeper(self: &Arc<Self>, core: &Rc<CoreHandle>) {
        if self.shared.sweeper_running.swap(true, Ordering::SeqCst) {
            return;
        }
        let (this, core) = (self.clone(), core.clone());
        glommio::spawn_local(async move { this.sweep(core).await }).detach();
    }

    /// After a restore: reads every linked stream's tail (writes that were not reported
    /// before the restart count as pending), then starts the wakes of pending work.
    async fn resume(self: &Arc<Self>, core: &Rc<CoreHandle>) {
        let linked = self.shared.read().linked_streams();
        for (id, streams) in linked {
            let mut tails = Vec::with_capacity(streams.len());
            for (path, name) in streams {
                match tail_of(core, &name).await {
                    Ok(tail) => tails.push((path, tail)),
                    Err(e) => log::warn!("subscription {id}: tail of {name}: {}", e.message),
                }
            }
            self.shared.write().refresh_tails(&id, &tails);
        }
        let effects = self.shared.write().resume(Clock::now());
        if !effects.is_empty() {
            log::info!(
                "subscriptions: {} woken for work pending since before the restart",
                effects.len()
            );
        }
        self.run_effects(core, effects);
    }

    async fn sweep(self: Arc<Self>, core: Rc<CoreHandle>) {
        if self.shared.read().resume_pending() {
            self.resume(&core).await;
        }
        // Logged once per run of failures, not every interval.
        let mut failing = false;
        loop {
            glommio::timer::sleep(SWEEP_INTERVAL).await;
            if self.shared.active.load(Ordering::SeqCst) == 0 && !self.shared.dirty() {
                self.shared.sweeper_running.store(false, Ordering::SeqCst);
                // A subscription created between the check and the store saw the flag still
                // set and started no sweeper: carry on as the sweeper unless another took over.
                if self.shared.active.load(Ordering::SeqCst) == 0
                    || self.shared.sweeper_running.swap(true, Ordering::SeqCst)
                {
                    return;
                }
            }
            let effects = self.shared.write().tick(Clock::now());
            self.run_effects(&core, effects);
            // What writes and timers changed since the last interval.
            if self.shared.dirty() {
                let shared = self.shared.clone();
                match glommio::executor()
                    .spawn_blocking(move || shared.persist())
                    .await
                {
                    Ok(()) => failing = false,
                    Err(e) if !failing => {
                        failing = true;
                        log::error!("subscriptions: {e} (retrying)");
                    }
                    Err(_) => {}
                }
            }
        }
    }
}
