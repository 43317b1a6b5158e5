//! What a panic does to a node. A core is one thread that serves thousands of connections, and
//! glommio does not catch a task's panic: uncaught, one bad request would take the thread down
//! while its listening socket kept queueing connections nobody answers.
//!
//! - A panic while a connection (or one HTTP/2 request) is being served is caught by
//!   [`CatchPanic`]: that connection or request ends, the panic is logged once and counted in
//!   `pico_connection_panics_total`, and the core keeps serving everyone else.
//! - A panic in one webhook delivery is caught by [`catch_unwind`]: that delivery fails (and is
//!   retried like any failed one), and the delivery thread goes on with the next.
//! - A panic anywhere else (an engine task, the upload thread, start-up) ends the process at
//!   once with a clear line on stderr, so a supervisor restarts the node instead of leaving a
//!   dead core behind a live socket. [`install_hook`] sets this up for `pico serve`.

use std::cell::Cell;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

/// Panics caught while serving connections, since start.
pub static CONNECTION_PANICS: AtomicU64 = AtomicU64::new(0);

/// Exit status of a node ended by a panic outside a connection (the status Rust gives an
/// uncaught panic in `main`).
pub const PANIC_EXIT_STATUS: i32 = 101;

thread_local! {
    /// How many [`CatchPanic`] polls or [`catch_unwind`] calls are on this thread's stack: a
    /// panic with none is fatal.
    static CATCHING: Cell<u32> = const { Cell::new(0) };
}

/// Makes a panic outside [`CatchPanic`] end the process (after the default report), and a
/// caught one print a single log line instead of the default report.
pub fn install_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let caught = CATCHING.try_with(Cell::get).unwrap_or(0) > 0;
        if caught {
            log::error!(
                "panic caught (the connection, request or delivery it was in ended; the node serves on): {info}"
            );
            return;
        }
        default(info);
        let thread = std::thread::current();
        eprintln!(
            "pico: fatal: thread {} panicked outside a connection; exiting so the node can be restarted",
            thread.name().unwrap_or("unnamed")
        );
        std::process::exit(PANIC_EXIT_STATUS);
    }));
}

/// Runs `f`, with a panic in it caught (`None`) rather than ending the process.
pub fn catch_unwind<R>(f: impl FnOnce() -> R) -> Option<R> {
    CATCHING.with(|c| c.set(c.get() + 1));
    let result = std::panic::catch_unwind(AssertUnwindSafe(f)).ok();
    CATCHING.with(|c| c.set(c.get() - 1));
    result
}

/// `future`, with a panic in any of its polls caught: it then completes with `Err(())`, and
/// whatever it owned is dropped (a connection's socket is closed).
pub fn catch_panic<F: Future>(future: F) -> CatchPanic<F> {
    CatchPanic {
        inner: Some(future),
    }
}

pin_project_lite::pin_project! {
    /// Not boxed: a request's future is moved once, into its task, not twice (the copy showed
    /// in profiles of the HTTP/2 append path).
    pub struct CatchPanic<F> {
        // `None` once done.
        #[pin]
        inner: Option<F>,
    }
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, ()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(Err(()));
        };
        CATCHING.with(|c| c.set(c.get() + 1));
        // The future is dropped right after a panic, so no state it broke is seen again.
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx)));
        CATCHING.with(|c| c.set(c.get() - 1));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                this.inner.set(None);
                Poll::Ready(Ok(output))
            }
            Err(_) => {
                this.inner.set(None);
                CONNECTION_PANICS.fetch_add(1, Ordering::Relaxed);
                Poll::Ready(Err(()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_future_completes_with_an_error_and_is_counted() {
        let before = CONNECTION_PANICS.load(Ordering::Relaxed);
        let caught = futures_lite::future::block_on(catch_panic(async {
            futures_lite::future::yield_now().await;
            let wire: &[u8] = b"1";
            wire[usize::from(wire[0])]
        }));
        assert!(caught.is_err());
        assert!(CONNECTION_PANICS.load(Ordering::Relaxed) > before);
        let fine = futures_lite::future::block_on(catch_panic(async { 7 }));
        assert_eq!(fine, Ok(7));
    }
}
