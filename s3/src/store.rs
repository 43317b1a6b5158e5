//! The upload thread and its handle, [`ObjectStore`].
//!
//! ```text
//!  any thread / executor                     pico-upload thread: tokio current-thread runtime
//!  ObjectStore::put ───┐                     dispatcher: recv ─▶ take a slot (≤ max_in_flight)
//!  ObjectStore::get ───┼─ tokio mpsc ──────▶            ─▶ spawn a task per request
//!  ObjectStore::list ──┘  (unbounded; send                   task: blocking I/O on the runtime's
//!                          never blocks)                     blocking pool (≤ max_in_flight threads),
//!                                                                or async S3 calls (reqwest)
//!        ◀──────────── futures oneshot, per request, in completion order ─────────────
//! ```
//!
//! `s3://` requests run as async tasks on the same runtime (HTTP via reqwest; SigV4 signing,
//! retries, multipart in `s3_bucket/`); `file://` and `mem://` run blocking code on the
//! runtime's blocking pool.
//!
//! Requests run concurrently and finish in any order: await a put before issuing a get that
//! must see it.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use std::path::PathBuf;

use bytes::Bytes;
use futures_channel::oneshot;
use tokio::sync::mpsc;
use tokio::sync::Semaphore;

use crate::backend::Backend;
use crate::backend::FileBucket;
use crate::backend::MemoryBucket;
use crate::key::validate_key;
use crate::key::validate_prefix;
use crate::limits::DEFAULT_MAX_IN_FLIGHT;
use crate::s3_bucket::ProbeError;
use crate::s3_bucket::S3Bucket;
use crate::s3_bucket::S3Config;
use crate::s3_bucket::S3Options;
use crate::Reply;
use crate::StorageLocation;
use crate::StorageUri;
use crate::StoreError;

/// The name of the upload thread, as seen in `top -H` and panics.
const THREAD_NAME: &str = "pico-upload";

/// Tuning of [`ObjectStore::open_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectStoreOptions {
    /// Most requests executing at once (at least 1). More requests wait in the queue, in order.
    /// (A multipart put is one request, with up to
    /// [`S3_PARTS_IN_FLIGHT`](crate::limits::S3_PARTS_IN_FLIGHT) of its parts in flight.)
    pub max_in_flight: usize,
    /// Tuning of `s3://` buckets (ignored by the others).
    pub s3: S3Options,
}

impl Default for ObjectStoreOptions {
    fn default() -> Self {
        ObjectStoreOptions {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            s3: S3Options::default(),
        }
    }
}

/// A handle to the upload thread. Cheap to clone, `Send + Sync`; every method returns at once
/// with a [`Reply`]. No method blocks the caller except [`ObjectStore::shutdown`].
///
/// The request queue is unbounded so an async caller never blocks; the engine bounds what it
/// queues (segments awaiting upload are capped by its own unuploaded-bytes limit).
///
/// Dropping the last handle, like [`ObjectStore::shutdown`], finishes every queued request
/// first, then joins the thread.
///
/// A reply resolving to `Err(Canceled)` means the answer was dropped unsent (the request's task
/// panicked or the thread died). Treat it as [`StoreError::Closed`]; a put may or may not have
/// been stored.
#[derive(Clone)]
pub struct ObjectStore {
    inner: Arc<Inner>,
}

/// Shared by all clones; its `Drop` is the "last handle dropped" shutdown.
struct Inner {
    uri: StorageUri,
    requests: mpsc::UnboundedSender<Request>,
    faults: Arc<Faults>,
    /// Why the bucket could not be reached when it was opened
    /// ([`S3Options::open_when_unreachable`]).
    unreachable_at_open: Option<String>,
    /// Taken by the first shutdown, so later ones (and `Drop`) do not join twice.
    thread: Mutex<Option<JoinHandle<()>>>,
}

enum Request {
    Put {
        key: String,
        data: Bytes,
        /// A durable local file whose first `data.len()` bytes are `data` (see
        /// [`ObjectStore::put_with_local_copy`]).
        local_copy: Option<PathBuf>,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Get {
        key: String,
        bytes_max: usize,
        reply: oneshot::Sender<Result<Bytes, StoreError>>,
    },
    GetRange {
        key: String,
        start: u64,
        end: u64,
        reply: oneshot::Sender<Result<Bytes, StoreError>>,
    },
    Delete {
        key: String,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    List {
        prefix: String,
        reply: oneshot::Sender<Result<Vec<(String, u64)>, StoreError>>,
    },
    /// Stop taking requests; finish the ones already taken.
    Shutdown,
}

impl ObjectStore {
    /// Opens a bucket with [`ObjectStoreOptions::default`]. See [`ObjectStore::open_with`].
    pub fn open(uri: &StorageUri) -> Result<ObjectStore, StoreError> {
        ObjectStore::open_with(uri, ObjectStoreOptions::default())
    }

    /// Opens a bucket and starts its `pico-upload` thread.
    ///
    /// `file://` creates the root directory. `mem://NAME` buckets are shared by name within the
    /// process (tests can "restart" a node against the same objects). `s3://` takes its
    /// credentials from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`
    /// (unless [`S3Options::credentials`] gives them; missing ones are a
    /// [`StoreError::BadUri`]), and by default probes the bucket (one ListObjectsV2 of one key)
    /// so a wrong secret, a missing bucket or an unreachable endpoint fails here, with a
    /// one-line explanation, instead of at the first upload.
    /// Blocking (it may create directories or wait for the probe): call it at startup, not from
    /// an executor.
    pub fn open_with(
        uri: &StorageUri,
        options: ObjectStoreOptions,
    ) -> Result<ObjectStore, StoreError> {
        let max_in_flight = options.max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
        let mut probe = false;
        let open_when_unreachable = options.s3.open_when_unreachable;
        let target = match &uri.location {
            StorageLocation::File(root) => {
                Target::Local(Arc::new(Backend::File(FileBucket::open(root)?)))
            }
            StorageLocation::Memory(name) => {
                Target::Local(Arc::new(Backend::Memory(MemoryBucket::open(name))))
            }
            StorageLocation::S3 { bucket, params } => {
                let config =
                    S3Config::new(bucket, params, options.s3.credentials.clone(), |name| {
                        std::env::var(name).ok()
                    })?;
                probe = options.s3.probe_at_open;
                Target::S3(Arc::new(S3Bucket::new(config, options.s3.clone())?))
            }
        };
        // The blocking pool runs the file I/O: with at most `max_in_flight` threads, a slow fsync
        // holds up one slot, never the runtime thread that dispatches the others.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .enable_io()
            .max_blocking_threads(max_in_flight)
            .thread_name(format!("{THREAD_NAME}-io"))
            .build()
            .map_err(|error| StoreError::Io(format!("start the {THREAD_NAME} runtime: {error}")))?;
        let (requests, receiver) = mpsc::unbounded_channel();
        let faults = Arc::new(Faults::default());
        let worker = Worker {
            target,
            faults: faults.clone(),
            max_in_flight,
        };
        // The probe runs on the upload thread's runtime (the caller may not be inside one, or
        // may be inside another); the thread reports its outcome before serving requests.
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.to_string())
            .spawn(move || {
                runtime.block_on(async move {
                    let outcome = match (&worker.target, probe) {
                        (Target::S3(bucket), true) => bucket.probe().await,
                        _ => Ok(()),
                    };
                    let outcome = match outcome {
                        Ok(()) => Ok(None),
                        Err(ProbeError::Unreachable(error)) if open_when_unreachable => {
                            Ok(Some(error.to_string()))
                        }
                        Err(ProbeError::Unreachable(error) | ProbeError::Refused(error)) => {
                            Err(error)
                        }
                    };
                    let failed = outcome.is_err();
                    let _ = ready.send(outcome);
                    if !failed {
                        worker.dispatch(receiver).await;
                    }
                })
            })
            .map_err(|error| StoreError::Io(format!("spawn the {THREAD_NAME} thread: {error}")))?;
        let outcome = started.recv().unwrap_or_else(|_| {
            Err(StoreError::Io(format!(
                "the {THREAD_NAME} thread died while opening {uri}"
            )))
        });
        let unreachable_at_open = match outcome {
            Ok(unreachable) => unreachable,
            Err(error) => {
                let _ = thread.join();
                return Err(error);
            }
        };
        let inner = Inner {
            uri: uri.clone(),
            requests,
            faults,
            unreachable_at_open,
            thread: Mutex::new(Some(thread)),
        };
        Ok(ObjectStore {
            inner: Arc::new(inner),
        })
    }

    /// Why the bucket could not be reached when it was opened, when
    /// [`S3Options::open_when_unreachable`] let it open anyway; `None` when it answered (or was
    /// not probed).
    pub fn unreachable_at_open(&self) -> Option<&str> {
        self.inner.unreachable_at_open.as_deref()
    }

    /// The URI this store was opened with (its `bucket_id` goes into object attributes).
    pub fn uri(&self) -> &StorageUri {
        &self.inner.uri
    }

    /// Stores `data` under `key`, replacing any object there. Once answered `Ok`, the object is
    /// whole and durable; a reader never sees part of it.
    pub fn put(&self, key: &str, data: Bytes) -> Reply<()> {
        self.put_request(key, data, None)
    }

    /// [`ObjectStore::put`] of bytes that are also the start of `local_copy`, a file already
    /// durable on this machine (a sealed WAL file). A `file://` bucket on the same filesystem
    /// then hard-links that file in place of writing the bytes again (the file is cut to
    /// `data.len()` first); any other bucket, or a link that fails, stores `data` as `put` does.
    /// The caller keeps its own name for the file until the object is no longer needed from it.
    pub fn put_with_local_copy(&self, key: &str, data: Bytes, local_copy: PathBuf) -> Reply<()> {
        self.put_request(key, data, Some(local_copy))
    }

    fn put_request(&self, key: &str, data: Bytes, local_copy: Option<PathBuf>) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        match validate_key(key) {
            Ok(()) => self.send(Request::Put {
                key: key.to_string(),
                data,
                local_copy,
                reply,
            }),
            Err(error) => drop(reply.send(Err(error))),
        }
        answer
    }

    /// The object's first `bytes_max` bytes, or all of it if it is shorter;
    /// [`StoreError::NotFound`] if there is none. Nothing past `bytes_max` is read into memory,
    /// whatever the store sends: the caller says how large the object may be (its catalog row).
    pub fn get(&self, key: &str, bytes_max: usize) -> Reply<Bytes> {
        let (reply, answer) = oneshot::channel();
        match validate_key(key) {
            Ok(()) => self.send(Request::Get {
                key: key.to_string(),
                bytes_max,
                reply,
            }),
            Err(error) => drop(reply.send(Err(error))),
        }
        answer
    }

    /// Bytes `start..end` (end exclusive) of the object. [`StoreError::NotFound`] if there is
    /// none; [`StoreError::Io`] if the range is inverted or ends past the object (never a short
    /// read).
    pub fn get_range(&self, key: &str, start: u64, end: u64) -> Reply<Bytes> {
        let (reply, answer) = oneshot::channel();
        match validate_key(key) {
            Ok(()) => self.send(Request::GetRange {
                key: key.to_string(),
                start,
                end,
                reply,
            }),
            Err(error) => drop(reply.send(Err(error))),
        }
        answer
    }

    /// Removes the object; a missing one is `Ok` (deletes are retried by GC, so they must be
    /// idempotent).
    pub fn delete(&self, key: &str) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        match validate_key(key) {
            Ok(()) => self.send(Request::Delete {
                key: key.to_string(),
                reply,
            }),
            Err(error) => drop(reply.send(Err(error))),
        }
        answer
    }

    /// Every object whose key starts with `prefix` (plain string prefix, as in S3), as
    /// `(key, size in bytes)` sorted by key. `""` lists the whole bucket.
    pub fn list(&self, prefix: &str) -> Reply<Vec<(String, u64)>> {
        let (reply, answer) = oneshot::channel();
        match validate_prefix(prefix) {
            Ok(()) => self.send(Request::List {
                prefix: prefix.to_string(),
                reply,
            }),
            Err(error) => drop(reply.send(Err(error))),
        }
        answer
    }

    /// The fault-injection seam for tests: make requests of this store fail or stall.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Finishes every request queued before this call, then stops and joins the thread (so it
    /// blocks: call it from a plain thread). Later requests on any clone answer
    /// [`StoreError::Closed`]. Idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    fn send(&self, request: Request) {
        if let Err(mpsc::error::SendError(request)) = self.inner.requests.send(request) {
            answer_closed(request);
        }
    }
}

impl Inner {
    fn shutdown(&self) {
        let _ = self.requests.send(Request::Shutdown);
        let thread = match self.thread.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(thread) = thread {
            // Joining ourselves would deadlock; the upload thread holds no handle, but be sure.
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                log::error!("the {THREAD_NAME} thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Answers a request that will never run because the thread is stopping or gone.
fn answer_closed(request: Request) {
    let _ = match request {
        Request::Put { reply, .. } | Request::Delete { reply, .. } => {
            reply.send(Err(StoreError::Closed)).map_err(drop)
        }
        Request::Get { reply, .. } | Request::GetRange { reply, .. } => {
            reply.send(Err(StoreError::Closed)).map_err(drop)
        }
        Request::List { reply, .. } => reply.send(Err(StoreError::Closed)).map_err(drop),
        Request::Shutdown => Ok(()),
    };
}

/// The bucket behind a store.
#[derive(Clone)]
enum Target {
    /// `file://` and `mem://`: blocking code, run on the blocking pool.
    Local(Arc<Backend>),
    /// `s3://`: async HTTP calls on the runtime.
    S3(Arc<S3Bucket>),
}

/// What runs on the upload thread.
struct Worker {
    target: Target,
    faults: Arc<Faults>,
    max_in_flight: usize,
}

impl Worker {
    /// Takes requests in arrival order, each after a free slot, and runs each as its own task.
    async fn dispatch(self, mut receiver: mpsc::UnboundedReceiver<Request>) {
        let slots = Arc::new(Semaphore::new(self.max_in_flight));
        // `recv` ends with `None` only when every handle is gone and the queue is empty.
        while let Some(request) = receiver.recv().await {
            if let Request::Shutdown = request {
                break;
            }
            let slot = slots
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let target = self.target.clone();
            let faults = self.faults.clone();
            tokio::spawn(async move {
                execute(target, &faults, request).await;
                drop(slot);
            });
        }
        // Every slot back means every spawned request has answered.
        let all =
            u32::try_from(self.max_in_flight).expect("max_in_flight is clamped to MAX_PERMITS");
        let _drained = slots
            .acquire_many(all)
            .await
            .expect("the semaphore is never closed");
        receiver.close();
        while let Ok(request) = receiver.try_recv() {
            answer_closed(request);
        }
        log::debug!("{THREAD_NAME} thread stopped");
    }
}

async fn execute(target: Target, faults: &Faults, request: Request) {
    // A caller that stopped waiting (dropped receiver) is fine: the result is dropped.
    match request {
        Request::Put {
            key,
            data,
            local_copy,
            reply,
        } => {
            let result = match (faults.apply(Operation::Put).await, target) {
                (Err(error), _) => Err(error),
                (Ok(()), Target::Local(backend)) => {
                    blocking(backend, move |b| b.put(&key, data, local_copy.as_deref())).await
                }
                (Ok(()), Target::S3(bucket)) => bucket.put(&key, data).await,
            };
            let _ = reply.send(result);
        }
        Request::Get {
            key,
            bytes_max,
            reply,
        } => {
            let result = match (faults.apply(Operation::Get).await, target) {
                (Err(error), _) => Err(error),
                (Ok(()), Target::Local(backend)) => {
                    blocking(backend, move |b| b.get(&key, bytes_max)).await
                }
                (Ok(()), Target::S3(bucket)) => bucket.get(&key, bytes_max).await,
            };
            let _ = reply.send(result);
        }
        Request::GetRange {
            key,
            start,
            end,
            reply,
        } => {
            let result = match (faults.apply(Operation::Get).await, target) {
                (Err(error), _) => Err(error),
                (Ok(()), Target::Local(backend)) => {
                    blocking(backend, move |b| b.get_range(&key, start, end)).await
                }
                (Ok(()), Target::S3(bucket)) => bucket.get_range(&key, start, end).await,
            };
            let _ = reply.send(result);
        }
        Request::Delete { key, reply } => {
            let result = match (faults.apply(Operation::Other).await, target) {
                (Err(error), _) => Err(error),
                (Ok(()), Target::Local(backend)) => {
                    blocking(backend, move |b| b.delete(&key)).await
                }
                (Ok(()), Target::S3(bucket)) => bucket.delete(&key).await,
            };
            let _ = reply.send(result);
        }
        Request::List { prefix, reply } => {
            let result = match (faults.apply(Operation::Other).await, target) {
                (Err(error), _) => Err(error),
                (Ok(()), Target::Local(backend)) => {
                    blocking(backend, move |b| b.list(&prefix)).await
                }
                (Ok(()), Target::S3(bucket)) => bucket.list(&prefix).await,
            };
            let _ = reply.send(result);
        }
        Request::Shutdown => unreachable!("dispatch() stops at Shutdown before spawning it"),
    }
}

/// Runs one blocking backend call on the blocking pool.
async fn blocking<T: Send + 'static>(
    backend: Arc<Backend>,
    work: impl FnOnce(&Backend) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::task::spawn_blocking(move || work(&backend)).await {
        Ok(result) => result,
        Err(error) => Err(StoreError::Io(format!(
            "object store worker failed: {error}"
        ))),
    }
}

#[derive(Clone, Copy)]
enum Operation {
    Put,
    Get,
    Other,
}

/// Injected faults, shared by every clone of one [`ObjectStore`]: the seam through which tests
/// make the object store fail or stall without a real broken store. All zero (no faults) unless
/// a test sets them. A failing request fails with [`StoreError::Io`] before touching the bucket.
#[derive(Debug, Default)]
pub struct Faults {
    failing_puts: AtomicU32,
    failing_gets: AtomicU32,
    delay_ms: AtomicU64,
    /// Requests inside the delay now, and the most there were at once.
    delayed_now: AtomicU32,
    delayed_peak: AtomicU32,
    /// Set: the next put waits (its slot held) until [`Faults::release_held_put`].
    hold_next_put: AtomicBool,
    held_put_released: tokio::sync::Notify,
    held_put_waiting: AtomicBool,
}

impl Faults {
    /// The next `count` puts fail (replaces any count still pending).
    pub fn fail_puts(&self, count: u32) {
        self.failing_puts.store(count, Ordering::SeqCst);
    }

    /// The next `count` gets or range gets fail (replaces any count still pending).
    pub fn fail_gets(&self, count: u32) {
        self.failing_gets.store(count, Ordering::SeqCst);
    }

    /// Every request waits `delay` before it runs, holding its in-flight slot like a slow store
    /// would. `Duration::ZERO` turns it off.
    pub fn set_delay(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(millis, Ordering::SeqCst);
    }

    /// The most requests that were waiting out the delay at once since the last call: how
    /// many the store's users kept in flight.
    pub fn take_peak_in_flight(&self) -> u32 {
        self.delayed_peak.swap(0, Ordering::SeqCst)
    }

    /// The next put waits, before it touches the bucket, until [`Faults::release_held_put`]:
    /// a PUT that is slow while the ones after it are not.
    pub fn hold_next_put(&self) {
        self.hold_next_put.store(true, Ordering::SeqCst);
    }

    /// Whether a put is waiting in [`Faults::hold_next_put`] now.
    pub fn put_is_held(&self) -> bool {
        self.held_put_waiting.load(Ordering::SeqCst)
    }

    /// Lets the held put (if any, or the next one to be held) go on.
    pub fn release_held_put(&self) {
        self.hold_next_put.store(false, Ordering::SeqCst);
        self.held_put_released.notify_one();
    }

    /// Removes every injected fault.
    pub fn clear(&self) {
        self.fail_puts(0);
        self.fail_gets(0);
        self.set_delay(Duration::ZERO);
        self.release_held_put();
    }

    async fn apply(&self, operation: Operation) -> Result<(), StoreError> {
        let delay_ms = self.delay_ms.load(Ordering::SeqCst);
        if delay_ms > 0 {
            let now = self.delayed_now.fetch_add(1, Ordering::SeqCst) + 1;
            self.delayed_peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            self.delayed_now.fetch_sub(1, Ordering::SeqCst);
        }
        if matches!(operation, Operation::Put) && self.hold_next_put.swap(false, Ordering::SeqCst) {
            self.held_put_waiting.store(true, Ordering::SeqCst);
            self.held_put_released.notified().await;
            self.held_put_waiting.store(false, Ordering::SeqCst);
        }
        let counter = match operation {
            Operation::Put => &self.failing_puts,
            Operation::Get => &self.failing_gets,
            Operation::Other => return Ok(()),
        };
        // Take one failure if any are left; never wraps below zero.
        let taken = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        });
        match taken {
            Ok(_) => Err(StoreError::Io("injected fault".to_string())),
            Err(_) => Ok(()),
        }
    }
}
