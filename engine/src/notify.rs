//! A single-waiter wake-up flag for tasks of one executor (the commit loop waits on it).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

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
