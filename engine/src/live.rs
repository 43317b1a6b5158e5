//! Live reads shared per core: all the long-polls and SSE subscribers of one core that wait
//! at the same offset of the same stream wait on one read.
//!
//! One read per core waits on the stream's owner, and when it returns, every subscriber of
//! that core takes a copy of its batch (the records are shared `Bytes`): 10,000 subscribers
//! each waiting on the owner would each be woken, read the same records again, and, from
//! another core, cross to the owner and back (docs/decisions/2026-12-shared-live-reads.md). The batch carries
//! the read's number (`ReadBatch::shared_read`), so the protocols encode its events once per
//! core (net/src/live.rs), not once per subscriber.
//!
//! Two requests share a read when they have the same stream and [`ReadShape`]: everything
//! that shapes the answer (the start offset, the budgets, whether the content type is asked
//! for). How long each
//! waits is its own: a read is started with the wait of the request that started it, and
//!
//! - a request whose own wait ends first keeps a timer of its own, stops waiting at it and
//!   reads once without waiting, as it would have at its deadline;
//! - a request that waits longer needs no timer: when it gets an empty batch (the shared wait
//!   ran out), it joins or starts the next shared read. Subscribers that joined after the
//!   read started (the usual case) are all of this kind, so a record wakes them without
//!   filing a timer per subscriber.
//!
//! A shared read lives as long as one request still waits on it: when its last subscriber
//! leaves, the read is dropped, and with it its waiter on the owning core.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_lite::future::{self, FutureExt as _};
use futures_util::future::{LocalBoxFuture, Shared, WeakShared};
use futures_util::FutureExt as _;

use crate::api::{ReadBatch, ReadFrom, ReadRequest};
use crate::clock::Clock;
use crate::error::ReadError;
use crate::fork;
use crate::metrics::GaugeGuard;
use crate::route::Router;

type Read = LocalBoxFuture<'static, Result<ReadBatch, ReadError>>;
type SharedRead = Shared<Read>;

/// What makes two live reads of a stream the same read, their waits aside: where they start
/// and the budgets that shape the answer. Every layer that shares live reads groups them by
/// this key alone: the shared reads here, and the network layer's parked subscribers
/// (`net/src/transport/http1/parked.rs`), whose group reads through one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReadShape {
    pub from: u64,
    pub max_records: usize,
    pub max_bytes: usize,
    pub with_content_type: bool,
}

impl ReadShape {
    /// The shape of `request`, if it can be shared: from a known offset, unbounded (a fork's
    /// read of what it inherited is its own).
    pub fn of(request: &ReadRequest) -> Option<ReadShape> {
        let ReadFrom::Offset(from) = request.from else {
            return None;
        };
        request
            .bound
            .is_none()
            .then(|| ReadShape::at(from, request))
    }

    /// `request`'s budgets, reading from `from`.
    fn at(from: u64, request: &ReadRequest) -> ReadShape {
        ReadShape {
            from,
            max_records: request.max_records,
            max_bytes: request.max_bytes,
            with_content_type: request.with_content_type,
        }
    }

    /// The read of this shape that waits up to `wait_ms` for new records.
    pub fn request(self, wait_ms: u64) -> ReadRequest {
        ReadRequest {
            from: ReadFrom::Offset(self.from),
            max_records: self.max_records,
            max_bytes: self.max_bytes,
            wait_ms: Some(wait_ms),
            with_content_type: self.with_content_type,
            bound: None,
        }
    }
}

/// One shared read in flight.
struct InFlight {
    shape: ReadShape,
    /// When the read stops waiting.
    deadline: Instant,
    /// Weak: a read none waits on any more is dropped, not kept alive by this map.
    read: WeakShared<Read>,
}

impl InFlight {
    /// The read, if some request still waits on it and it has not answered yet (an answer
    /// given before a request came is not one for it).
    fn pending(&self) -> Option<SharedRead> {
        self.read.upgrade().filter(|read| read.peek().is_none())
    }
}

/// This core's live reads in flight, by stream name (looked up without a copy of the name).
#[derive(Default)]
pub(crate) struct LiveReads {
    /// Where the reads' deadlines are read.
    clock: Clock,
    reads: RefCell<HashMap<Box<str>, Vec<InFlight>>>,
    /// Reads filed since the map was last swept of finished ones.
    filed: Cell<usize>,
    /// The map is swept when that many were filed, which then doubles past what stays, so a
    /// sweep costs O(1) per read started.
    sweep_at: Cell<usize>,
}

/// Reads that wait at least this long are shared; a shorter wait is over before another
/// request could join it.
const SHARED_WAIT_MIN_MS: u64 = 1;

/// The fewest filed reads at which the map is swept.
const SWEEP_AT_MIN: usize = 64;

/// Numbers the shared reads of every core of this process (`ReadBatch::shared_read`).
static SHARED_READS: AtomicU64 = AtomicU64::new(0);

impl LiveReads {
    pub(crate) fn new(clock: Clock) -> LiveReads {
        LiveReads {
            clock,
            ..LiveReads::default()
        }
    }

    /// `request` answered through a read shared with this core's other requests for the same
    /// records, or `None` when it is not a live read (the caller reads it alone). A read from
    /// the tail or from the first readable record learns its offset first, from a read that
    /// does not wait. While it waits, the request counts as a reader waiting on this core
    /// (`live_waiters`).
    pub(crate) async fn read(
        &self,
        router: &Rc<Router>,
        name: &str,
        request: &ReadRequest,
    ) -> Option<Result<ReadBatch, ReadError>> {
        let wait_ms = request.wait_ms.filter(|&ms| ms >= SHARED_WAIT_MIN_MS)?;
        if request.bound.is_some() {
            return None;
        }
        let deadline = self.clock.now() + Duration::from_millis(wait_ms);
        let _waiting = GaugeGuard::enter(&router.shard.metrics().live_waiters);
        let from = match request.from {
            ReadFrom::Offset(from) => from,
            // Where such a read starts only the owning core knows (the tail, the first
            // readable record): ask it without waiting, then wait there with the others.
            ReadFrom::Tail | ReadFrom::AtLeast(_) => {
                let batch = match read_without_waiting(router, name, request).await {
                    Ok(batch) => batch,
                    Err(e) => return Some(Err(e)),
                };
                if !batch.records.is_empty() || batch.closed || router.shard.is_stopping() {
                    return Some(Ok(batch));
                }
                batch.next_offset
            }
        };
        // `request.from` is `from` from here on, passed apart: a copy of the request (or of its
        // shape) with it would be held by every waiting subscriber.
        loop {
            // A temporary: a named shape would be kept across the wait below.
            let (shared, shared_deadline) =
                self.join(router, name, ReadShape::at(from, request), deadline);
            let answer = if shared_deadline <= deadline {
                // The shared read ends first: no timer of this request's own (10,000
                // subscribers would each file one in the reactor per record).
                Some(shared.await)
            } else {
                let rest = deadline.saturating_duration_since(self.clock.now());
                async { Some(shared.await) }
                    .or(async {
                        glommio::timer::sleep(rest).await;
                        None
                    })
                    .await
            };
            match answer {
                // The shared wait ran out before this request's did: wait on.
                Some(Ok(batch))
                    if batch.records.is_empty()
                        && !batch.closed
                        && batch.inherit.is_none()
                        && !router.shard.is_stopping()
                        && self.clock.now() < deadline => {}
                Some(answer) => return Some(answer),
                None => break,
            }
            future::yield_now().await;
        }
        // This request's own wait is over: what is there now.
        let now = ReadShape::at(from, request).request(0);
        Some(read_without_waiting(router, name, &now).await)
    }

    /// The read in flight of `shape` and when it stops waiting, or a new one waiting until
    /// `deadline`.
    fn join(
        &self,
        router: &Rc<Router>,
        name: &str,
        shape: ReadShape,
        deadline: Instant,
    ) -> (SharedRead, Instant) {
        let mut reads = self.reads.borrow_mut();
        if let Some(in_flight) = reads.get(name) {
            let same = in_flight.iter().filter(|r| r.shape == shape);
            if let Some((read, ends)) = same.filter_map(|r| Some((r.pending()?, r.deadline))).next()
            {
                return (read, ends);
            }
        }
        self.filed.set(self.filed.get() + 1);
        if self.filed.get() >= self.sweep_at.get().max(SWEEP_AT_MIN) {
            reads.retain(|_, in_flight| {
                in_flight.retain(|r| r.pending().is_some());
                !in_flight.is_empty()
            });
            let stays = reads.values().map(Vec::len).sum::<usize>();
            self.filed.set(0);
            self.sweep_at.set(stays * 2);
        }
        let wait = deadline.saturating_duration_since(self.clock.now());
        let shared_request =
            shape.request(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1));
        let (router, owned_name) = (router.clone(), name.to_string());
        let number = SHARED_READS.fetch_add(1, Ordering::Relaxed);
        let read: Read = Box::pin(async move {
            let mut answer = fork::read(&router, &owned_name, shared_request).await;
            if let Ok(batch) = &mut answer {
                batch.shared_read = Some(number);
            }
            answer
        });
        let shared = read.shared();
        if let Some(weak) = shared.downgrade() {
            let in_flight = InFlight {
                shape,
                deadline,
                read: weak,
            };
            match reads.get_mut(name) {
                Some(list) => list.push(in_flight),
                None => {
                    reads.insert(name.into(), vec![in_flight]);
                }
            }
        }
        (shared, deadline)
    }
}

/// `request` read once, answered with what is there now (on the heap: a parked live read
/// holds no room for it).
async fn read_without_waiting(
    router: &Router,
    name: &str,
    request: &ReadRequest,
) -> Result<ReadBatch, ReadError> {
    let now = ReadRequest {
        wait_ms: Some(0),
        ..request.clone()
    };
    Box::pin(fork::read(router, name, now)).await
}
