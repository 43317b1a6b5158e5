//! The node-wide stop signal of a graceful shutdown, and each core's idle deadlines.
//!
//! The main thread sets [`Shutdown`] once (after the drain window) and wakes one task per core
//! (a foreign wake: the core's executor is woken through its event descriptor), which wakes
//! the core's waiting tasks (idle connections, accept loops): ten thousand idle connections
//! cost one registration, not ten thousand. An idle core sleeps until the signal; nothing
//! looks at a flag on a timer. A second task per core ends the waits of connections idle past
//! their limit ([`CoreShutdown::unless_stopped_within`]), scanning every
//! [`DEADLINE_SCAN_INTERVAL`] only while some wait has a limit: a keep-alive connection waits
//! for its next request once per request, and a timer of its own (inserted into and removed
//! from the executor's ordered timer map) cost more than parsing the request.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;

/// How often a core ends the waits past their deadline while any wait has one: an idle limit
/// is kept to within about 100 ms, and a scan costs a few instructions per idle connection.
const DEADLINE_SCAN_INTERVAL: Duration = Duration::from_millis(100);

/// Set by the main thread; shared with every core.
#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Arc<Signal>,
}

#[derive(Default)]
struct Signal {
    flag: AtomicBool,
    /// The waker of each core's signal task (a slot per core, emptied when the task ends).
    cores: Mutex<Slab<Waker>>,
}

impl Shutdown {
    /// Sets the signal and wakes every core's signal task (from any thread).
    pub fn begin(&self) {
        self.inner.flag.store(true, Ordering::SeqCst);
        let wakers: Vec<Waker> = self.cores().drain().collect();
        for waker in wakers {
            waker.wake();
        }
    }

    fn cores(&self) -> std::sync::MutexGuard<'_, Slab<Waker>> {
        // A poisoned lock still holds valid wakers: a panic elsewhere must not keep the
        // signal from the cores.
        self.inner
            .cores
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The core-local view; call on the core's executor (it starts the core's two tasks).
    pub fn on_this_core(&self) -> CoreShutdown {
        let local = CoreShutdown {
            inner: Rc::new(Local {
                set: Cell::new(false),
                waiters: RefCell::new(Slab::new()),
                deadline_scan: RefCell::new(None),
            }),
        };
        let signal = SignalWait {
            shutdown: self.clone(),
            slot: None,
        };
        let watcher = local.inner.clone();
        glommio::spawn_local(async move {
            signal.await;
            watcher.set.set(true);
            for (_, waiting) in watcher.waiters.borrow_mut().iter_mut() {
                waiting.waker.wake_by_ref();
            }
            if let Some(scan) = watcher.deadline_scan.borrow_mut().take() {
                scan.wake();
            }
        })
        .detach();
        let scanner = local.inner.clone();
        glommio::spawn_local(async move {
            // Whether some wait has a deadline still to come: each scan says, so an interval
            // walks the waits once.
            let mut pending = scanner.has_deadlines();
            while !scanner.set.get() {
                if pending {
                    glommio::timer::sleep(DEADLINE_SCAN_INTERVAL).await;
                    pending = scanner.end_waits_past(Instant::now());
                } else {
                    DeadlineRegistered { local: &scanner }.await;
                    pending = true;
                }
            }
        })
        .detach();
        local
    }
}

/// A core's wait for the signal: its waker sits in its slot of [`Signal::cores`] while it
/// waits, and leaves it when the wait ends or is dropped (the core's executor ending).
struct SignalWait {
    shutdown: Shutdown,
    slot: Option<usize>,
}

impl Future for SignalWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this.shutdown.inner.flag.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        let mut cores = this.shutdown.cores();
        match this.slot {
            Some(slot) if cores.contains(slot) => cores[slot] = cx.waker().clone(),
            _ => this.slot = Some(cores.insert(cx.waker().clone())),
        }
        drop(cores);
        // `begin` may have set the flag and taken the wakers just before this one was filed.
        if this.shutdown.inner.flag.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for SignalWait {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            // `try_remove`: `begin` may have drained the slot already.
            let taken = self.shutdown.cores().try_remove(slot);
            drop(taken);
        }
    }
}

/// Resolves once a wait with a deadline is registered (or the shutdown began).
struct DeadlineRegistered<'a> {
    local: &'a Local,
}

impl Future for DeadlineRegistered<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.local.set.get() || self.local.has_deadlines() {
            return Poll::Ready(());
        }
        *self.local.deadline_scan.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

struct Local {
    set: Cell<bool>,
    /// Tasks waiting for the signal or for a deadline (a dropped wait removes its entry).
    waiters: RefCell<Slab<Waiting>>,
    /// The deadline task, waiting for a wait with a deadline: woken by the next one.
    deadline_scan: RefCell<Option<Waker>>,
}

/// A task waiting for the stop signal, or for whichever of it and its deadline comes first.
struct Waiting {
    waker: Waker,
    deadline: Option<Instant>,
    /// The deadline passed: the wait is over.
    expired: bool,
}

impl Local {
    /// Whether a wait with a deadline that has not passed is registered.
    fn has_deadlines(&self) -> bool {
        self.waiters
            .borrow()
            .iter()
            .any(|(_, waiting)| waiting.deadline.is_some() && !waiting.expired)
    }

    /// Ends (and wakes) the waits whose deadline is `now` or earlier; whether a wait with a
    /// later deadline remains.
    fn end_waits_past(&self, now: Instant) -> bool {
        let mut later = false;
        for (_, waiting) in self.waiters.borrow_mut().iter_mut() {
            match waiting.deadline {
                Some(deadline) if !waiting.expired && deadline <= now => {
                    waiting.expired = true;
                    waiting.waker.wake_by_ref();
                }
                Some(_) if !waiting.expired => later = true,
                _ => {}
            }
        }
        later
    }

    /// Registers a wait (its key), or updates the waker of the registered one; whether its
    /// deadline has passed.
    fn register(&self, key: &mut Option<usize>, waker: &Waker, limit: Option<Duration>) -> bool {
        let mut waiters = self.waiters.borrow_mut();
        match *key {
            Some(at) => {
                let waiting = &mut waiters[at];
                if !waiting.waker.will_wake(waker) {
                    waiting.waker = waker.clone();
                }
                waiting.expired
            }
            None => {
                let deadline = limit.map(|limit| Instant::now() + limit);
                *key = Some(waiters.insert(Waiting {
                    waker: waker.clone(),
                    deadline,
                    expired: false,
                }));
                if deadline.is_some() {
                    if let Some(scan) = self.deadline_scan.borrow_mut().take() {
                        scan.wake();
                    }
                }
                false
            }
        }
    }
}

/// A registered wait, removed when dropped.
struct Registration {
    local: Rc<Local>,
    key: Option<usize>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.local.waiters.borrow_mut().remove(key);
        }
    }
}

/// One core's view of the stop signal.
#[derive(Clone)]
pub struct CoreShutdown {
    inner: Rc<Local>,
}

impl CoreShutdown {
    pub fn is_set(&self) -> bool {
        self.inner.set.get()
    }

    /// `future`'s output, or `None` if the shutdown begins first (the future is dropped). Not
    /// an `async fn`, which would hold `future` twice (see `transport::message::within`).
    pub fn unless_stopped<T>(
        &self,
        future: impl std::future::Future<Output = T>,
    ) -> impl std::future::Future<Output = Option<T>> {
        self.stopped_or(None, future)
    }

    /// `future`'s output, or `None` if the shutdown begins first or `limit` passes while it
    /// waits (kept to within about 100 ms, see [`DEADLINE_SCAN_INTERVAL`]; `limit` is meant for
    /// idle limits of seconds, not for precise timing). `future` is polled first, so one that
    /// is ready at once costs no registration.
    pub fn unless_stopped_within<T>(
        &self,
        limit: Duration,
        future: impl std::future::Future<Output = T>,
    ) -> impl std::future::Future<Output = Option<T>> {
        self.stopped_or(Some(limit), future)
    }

    fn stopped_or<F: Future>(&self, limit: Option<Duration>, future: F) -> StoppedOr<F> {
        StoppedOr {
            future,
            limit,
            registration: Registration {
                local: self.inner.clone(),
                key: None,
            },
        }
    }

    /// Resolves once the shutdown began.
    pub fn wait(&self) -> Wait {
        Wait {
            registration: Registration {
                local: self.inner.clone(),
                key: None,
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`CoreShutdown::unless_stopped`] and [`CoreShutdown::unless_stopped_within`].
    pub struct StoppedOr<F> {
        #[pin]
        future: F,
        limit: Option<Duration>,
        registration: Registration,
    }
}

impl<F: Future> Future for StoppedOr<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Some(output));
        }
        let registration = this.registration;
        if registration.local.set.get() {
            return Poll::Ready(None);
        }
        let expired = registration
            .local
            .register(&mut registration.key, cx.waker(), *this.limit);
        if expired {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// The future of [`CoreShutdown::wait`].
pub struct Wait {
    registration: Registration,
}

impl Future for Wait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let registration = &mut self.registration;
        if registration.local.set.get() {
            return Poll::Ready(());
        }
        registration
            .local
            .register(&mut registration.key, cx.waker(), None);
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(stop: &CoreShutdown) -> usize {
        stop.inner.waiters.borrow().len()
    }

    #[test]
    fn a_wait_within_a_limit_ends_once_the_limit_passed_and_leaves_no_entry() {
        glommio::LocalExecutor::default().run(async {
            let stop = Shutdown::default().on_this_core();
            // Ready at once: nothing is registered.
            assert_eq!(
                stop.unless_stopped_within(Duration::from_secs(60), async { 7 })
                    .await,
                Some(7)
            );
            assert_eq!(waits(&stop), 0);

            let started = Instant::now();
            let never = futures_lite::future::pending::<()>();
            let ended = stop
                .unless_stopped_within(Duration::from_millis(300), never)
                .await;
            let waited = started.elapsed();
            assert_eq!(ended, None);
            assert!(
                waited >= Duration::from_millis(300),
                "ended early, after {waited:?}"
            );
            // A generous bound: the scan runs every 100 ms, but a busy machine delays timers.
            assert!(waited < Duration::from_secs(10), "ended after {waited:?}");
            assert_eq!(waits(&stop), 0);

            // A wait dropped before its deadline takes its entry with it.
            let dropped = stop.unless_stopped_within(
                Duration::from_secs(60),
                futures_lite::future::pending::<()>(),
            );
            let mut dropped = Box::pin(dropped);
            assert!(futures_lite::future::poll_once(dropped.as_mut())
                .await
                .is_none());
            assert_eq!(waits(&stop), 1);
            drop(dropped);
            assert_eq!(waits(&stop), 0);
        });
    }

    #[test]
    fn a_core_without_deadlines_waits_on_no_timer_and_another_thread_wakes_it() {
        glommio::LocalExecutor::default().run(async {
            let shutdown = Shutdown::default();
            let stop = shutdown.on_this_core();
            glommio::timer::sleep(Duration::from_millis(20)).await;
            // Both tasks wait for an event, not a timer: the signal task in the node-wide
            // list, the deadline task for a wait with a deadline.
            assert_eq!(shutdown.cores().len(), 1);
            assert!(stop.inner.deadline_scan.borrow().is_some());
            // A wait with a deadline wakes the deadline task; once it ended, the task waits
            // for the next one again.
            let ended = stop
                .unless_stopped_within(
                    Duration::from_millis(150),
                    futures_lite::future::pending::<()>(),
                )
                .await;
            assert_eq!(ended, None);
            glommio::timer::sleep(DEADLINE_SCAN_INTERVAL * 3).await;
            assert!(stop.inner.deadline_scan.borrow().is_some());

            // The main thread's `begin` wakes the core through its executor.
            let from_another_thread = shutdown.clone();
            let started = Instant::now();
            let thread = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                from_another_thread.begin();
            });
            stop.wait().await;
            assert!(started.elapsed() < Duration::from_secs(10));
            thread.join().unwrap();
            assert!(stop.is_set());
            assert_eq!(shutdown.cores().len(), 0);
        });
    }

    #[test]
    fn the_shutdown_ends_waits_long_before_their_limit() {
        glommio::LocalExecutor::default().run(async {
            let shutdown = Shutdown::default();
            let stop = shutdown.on_this_core();
            let waiting = glommio::spawn_local({
                let stop = stop.clone();
                async move {
                    let within = stop.unless_stopped_within(
                        Duration::from_secs(600),
                        futures_lite::future::pending::<()>(),
                    );
                    let plain = stop.unless_stopped(futures_lite::future::pending::<()>());
                    futures_lite::future::zip(within, plain).await
                }
            });
            glommio::timer::sleep(Duration::from_millis(50)).await;
            assert_eq!(waits(&stop), 2);
            let started = Instant::now();
            shutdown.begin();
            assert_eq!(waiting.await, (None, None));
            assert!(started.elapsed() < Duration::from_secs(10));
            assert_eq!(waits(&stop), 0);
            // Once stopped, a new wait ends at once.
            stop.wait().await;
        });
    }
}
