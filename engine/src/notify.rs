//! Wake-ups for tasks of one executor.
//!
//! - [`LocalNotify`]: one waiter (a loop such as the commit loop); a notify with nobody waiting
//!   is remembered for the next wait.
//! - [`LocalBroadcast`]: any number of waiters (every request that arrived during a stream's
//!   hand-off); a notify wakes everyone who started waiting before it.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A single-waiter wake-up flag: a second concurrent waiter would replace the first one's
/// waker, so use [`LocalBroadcast`] where several tasks wait.
#[derive(Default)]
pub(crate) struct LocalNotify {
    pending: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl LocalNotify {
    pub(crate) fn notify(&self) {
        self.pending.set(true);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Resolves once `notify` was called since the last wait returned.
    pub(crate) fn wait(&self) -> impl Future<Output = ()> + '_ {
        Wait { notify: self }
    }
}

struct Wait<'a> {
    notify: &'a LocalNotify,
}

impl Future for Wait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.pending.replace(false) {
            return Poll::Ready(());
        }
        self.notify.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

/// A wake-up for every waiter: each `notify` starts a new generation, and a wait resolves once
/// the generation it was created in has passed. The check a waiter makes before waiting
/// ("is the hand-off still on?") and the creation of the wait run without a yield between
/// them, so no notify falls in the gap.
#[derive(Default)]
pub(crate) struct LocalBroadcast {
    generation: Cell<u64>,
    /// One entry per pending poll of a waiting task; drained by `notify`. A task waiting
    /// here is only polled again when woken, so the list holds at most one waker per waiter.
    wakers: RefCell<Vec<Waker>>,
}

impl LocalBroadcast {
    pub(crate) fn notify(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for waker in wakers {
            waker.wake();
        }
    }

    /// Resolves at the next `notify` after this call.
    pub(crate) fn wait(&self) -> impl Future<Output = ()> + '_ {
        BroadcastWait {
            broadcast: self,
            generation: self.generation.get(),
        }
    }
}

struct BroadcastWait<'a> {
    broadcast: &'a LocalBroadcast,
    generation: u64,
}

impl Future for BroadcastWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.broadcast.generation.get() != self.generation {
            return Poll::Ready(());
        }
        let mut wakers = self.broadcast.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// Counts its wake-ups: one per waiting task.
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every request that arrived during a hand-off waits on one broadcast; each must be woken
    /// and then resolve (with a single waker slot only the last one was, the others hung).
    #[test]
    fn a_broadcast_wakes_every_waiter() {
        let broadcast = LocalBroadcast::default();
        let counters: Vec<Arc<Counted>> = (0..3)
            .map(|_| Arc::new(Counted(AtomicUsize::new(0))))
            .collect();
        let wakers: Vec<Waker> = counters.iter().map(|c| Waker::from(c.clone())).collect();
        let mut waits: Vec<_> = (0..3).map(|_| Box::pin(broadcast.wait())).collect();
        for (wait, waker) in waits.iter_mut().zip(&wakers) {
            assert!(wait
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending());
        }
        broadcast.notify();
        for ((wait, waker), counter) in waits.iter_mut().zip(&wakers).zip(&counters) {
            assert_eq!(
                counter.0.load(Ordering::Relaxed),
                1,
                "every waiter is woken"
            );
            assert!(wait
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_ready());
        }
    }

    #[test]
    fn a_wait_created_after_a_notify_waits_for_the_next_one() {
        let broadcast = LocalBroadcast::default();
        broadcast.notify();
        let mut wait = Box::pin(broadcast.wait());
        let mut cx = Context::from_waker(Waker::noop());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        assert!(
            wait.as_mut().poll(&mut cx).is_pending(),
            "a second poll keeps waiting"
        );
        broadcast.notify();
        assert!(wait.as_mut().poll(&mut cx).is_ready());
    }

    /// What the hand-off used before: a second waiter takes the first one's slot.
    #[test]
    fn a_single_waiter_flag_wakes_only_the_last_waiter() {
        let notify = LocalNotify::default();
        let first = Arc::new(Counted(AtomicUsize::new(0)));
        let second = Arc::new(Counted(AtomicUsize::new(0)));
        let (w1, w2) = (Waker::from(first.clone()), Waker::from(second.clone()));
        let mut a = Box::pin(notify.wait());
        let mut b = Box::pin(notify.wait());
        assert!(a.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
        assert!(b.as_mut().poll(&mut Context::from_waker(&w2)).is_pending());
        notify.notify();
        assert_eq!(first.0.load(Ordering::Relaxed), 0);
        assert_eq!(second.0.load(Ordering::Relaxed), 1);
    }
}
