//! The node-wide stop signal of a graceful shutdown.
//!
//! The main thread sets [`Shutdown`] once (after the drain window). Each core turns it into a
//! [`CoreShutdown`]: one task per core looks at the flag every few milliseconds and wakes the
//! core's waiting tasks (idle connections, accept loops), so ten thousand idle connections cost
//! one timer, not ten thousand.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How often each core looks at the flag.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Set by the main thread; shared with every core.
#[derive(Clone, Default)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
}

impl Shutdown {
    pub fn begin(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// The core-local view; call on the core's executor (it starts the core's watcher task).
    pub fn on_this_core(&self) -> CoreShutdown {
        let local = CoreShutdown {
            inner: Rc::new(Local {
                set: Cell::new(false),
                waiters: RefCell::new(HashMap::default()),
                next_id: Cell::new(0),
            }),
        };
        let (flag, watcher) = (self.flag.clone(), local.inner.clone());
        glommio::spawn_local(async move {
            while !flag.load(Ordering::SeqCst) {
                glommio::timer::sleep(POLL_INTERVAL).await;
            }
            watcher.set.set(true);
            for (_, waker) in watcher.waiters.borrow_mut().drain() {
                waker.wake();
            }
        })
        .detach();
        local
    }
}

struct Local {
    set: Cell<bool>,
    /// Tasks waiting for the signal, by wait id (a dropped wait removes its entry).
    waiters: RefCell<HashMap<u64, Waker, BuildHasherDefault<WaitIdHasher>>>,
    next_id: Cell<u64>,
}

/// Hashes a wait id by one multiplication. The ids are the core's own counter, never a peer's
/// input, so they need none of SipHash's resistance to chosen keys; every request waits once,
/// and SipHash costs more than the rest of its wait.
#[derive(Default)]
struct WaitIdHasher(u64);

impl Hasher for WaitIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(self.0 ^ u64::from(byte));
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: consecutive ids spread over the high bits hashbrown tags with.
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
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
    pub fn unless_stopped<'a, T>(
        &'a self,
        future: impl std::future::Future<Output = T> + 'a,
    ) -> impl std::future::Future<Output = Option<T>> + 'a {
        let future = crate::transport::message::SomeOf { future };
        futures_lite::future::or(future, async move {
            self.wait().await;
            None
        })
    }

    /// Resolves once the shutdown began.
    pub fn wait(&self) -> Wait {
        let id = self.inner.next_id.get();
        self.inner.next_id.set(id + 1);
        Wait {
            local: self.inner.clone(),
            id,
        }
    }
}

/// The future of [`CoreShutdown::wait`].
pub struct Wait {
    local: Rc<Local>,
    id: u64,
}

impl Future for Wait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.local.set.get() {
            return Poll::Ready(());
        }
        self.local
            .waiters
            .borrow_mut()
            .insert(self.id, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        self.local.waiters.borrow_mut().remove(&self.id);
    }
}
