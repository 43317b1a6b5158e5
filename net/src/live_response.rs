//! What both protocols' live SSE responses share: the floor of their keep-alive interval, the
//! length of one idle round, one read at the tail (docs/api.md, "Read"), and the events of a
//! shared read encoded once per core.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pico_engine::{limits, CoreHandle, ReadBatch, ReadFrom, ReadRequest};

/// The shortest idle time between keep-alives: a `--long-poll-timeout-sec` of 0 (long-polls
/// answer at once) must not turn an idle SSE response into a stream of keep-alives.
pub const KEEP_ALIVE_MIN_MS: u64 = 100;

/// The last events of a live response, written at its deadline, may take this long to leave
/// before the connection is closed instead (a reader that keeps up never waits for it).
pub const END_WRITE_GRACE: Duration = Duration::from_secs(1);

/// The wait of one round of a live SSE response (both protocols) that is idle at the tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdleRound {
    /// Wait this long for new records...
    pub wait_ms: u64,
    /// ...and if none came, the response is over: the wait ran to its deadline.
    pub last: bool,
}

impl IdleRound {
    /// A keep-alive interval's wait, or the rest of the response's time if that is shorter;
    /// `None` once the deadline has passed. The rest is rounded up to a whole millisecond, and
    /// the round that reaches the deadline is marked last, so the end of a response never
    /// turns into zero-length waits that each send a keep-alive.
    pub fn next(deadline: Instant, interval_ms: u64) -> Option<IdleRound> {
        let rest = deadline.checked_duration_since(Instant::now())?;
        if rest.is_zero() {
            return None;
        }
        let rest_ms = u64::try_from(rest.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        Some(if rest_ms <= interval_ms {
            IdleRound {
                wait_ms: rest_ms,
                last: true,
            }
        } else {
            IdleRound {
                wait_ms: interval_ms,
                last: false,
            }
        })
    }
}

/// One read of a live response (both protocols): the batch, and whether it must be the
/// response's last because the node is stopping (it ends cleanly once that batch is sent).
/// `None` when the stream is deleted, expired or failing: the response ends, and the client's
/// reconnect gets the error.
pub(crate) async fn live_read(
    core: &CoreHandle,
    name: &str,
    request: &ReadRequest,
) -> Option<(ReadBatch, bool)> {
    match core.read(name, request).await {
        Ok(batch) => Some((batch, core.is_stopping())),
        _ => None,
    }
}

/// A live SSE response between reads (both protocols): what it reads next and the events each
/// answer makes. It holds no future: the one driver (`transport/drive.rs`) runs it in its
/// connection's task over any transport, or, while it waits at the tail of a plain HTTP/1.1
/// connection, the core's parked subscribers take the same steps for it
/// (`transport/http1/parked.rs`), so a waiting subscriber is this state, its socket and
/// little else.
pub trait LiveEvents {
    /// The core that reads for it.
    fn core(&self) -> &Rc<CoreHandle>;
    /// The stream it reads.
    fn stream_name(&self) -> &str;
    /// The next event ready to be sent.
    fn pop_event(&mut self) -> Option<Bytes>;
    /// The next read, waiting at most until the next keep-alive or the end of the response
    /// (its round); `None` once the response is over.
    fn next_read(&mut self) -> Option<ReadRequest>;
    /// What the read of the round gave (`None`: the stream is gone or failing, and the
    /// response ends). Its events are queued.
    fn answer(&mut self, read: Option<&(ReadBatch, bool)>);
    /// Whether it waits at the tail: nothing is queued, the response is not over and its next
    /// read is one that waits for new records.
    fn at_tail(&self) -> bool;
    /// When the response must be over (`--sse-max-duration-sec`, and [`END_WRITE_GRACE`] for
    /// its last events): a write still waiting for its reader then closes the connection, so a
    /// reader that stopped reading is not held past it. `None`: no deadline.
    fn deadline(&self) -> Option<Instant> {
        None
    }
}

/// The events a live response has ready to send: at most two at a time (a data event and the
/// control event behind it; Pico's first ones, the `retry:` hint and a control event), kept
/// inline, where a `VecDeque` would keep a 128-byte buffer on the heap for every subscriber.
#[derive(Default)]
pub(crate) struct ReadyEvents {
    first: Option<Bytes>,
    second: Option<Bytes>,
}

impl ReadyEvents {
    pub fn push(&mut self, event: Bytes) {
        match (&mut self.first, &mut self.second) {
            (first @ None, _) => *first = Some(event),
            (_, second @ None) => *second = Some(event),
            // Never more than two are queued; were a third, it joins the second.
            (_, Some(second)) => {
                let mut joined = Vec::with_capacity(second.len() + event.len());
                joined.extend_from_slice(second);
                joined.extend_from_slice(&event);
                *second = joined.into();
            }
        }
    }

    pub fn pop(&mut self) -> Option<Bytes> {
        let event = self.first.take();
        self.first = self.second.take();
        event
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}

/// Where a live response is between reads, both protocols: the stream and the offset it reads
/// from, its rounds (a keep-alive when one passes quiet, the end at the deadline) and the
/// events ready to send.
pub(crate) struct LiveCursor {
    pub core: Rc<CoreHandle>,
    pub name: String,
    pub from: ReadFrom,
    pub chunk_bytes: usize,
    /// The longest quiet time before a keep-alive.
    pub keep_alive_ms: u64,
    /// When the response ends (the client reconnects).
    pub deadline: Instant,
    pub done: bool,
    /// The round of the read in flight is the response's last (its wait reaches the deadline).
    pub last_round: bool,
    pub queue: ReadyEvents,
    /// The token reloads when the response started (`auth::table_reloads`): after another,
    /// the response ends at its next read, and its client is checked again as it reconnects.
    pub token_reloads: u64,
}

impl LiveCursor {
    pub fn new(
        core: Rc<CoreHandle>,
        name: String,
        from: ReadFrom,
        chunk_bytes: usize,
        keep_alive_ms: u64,
        max_duration_ms: u64,
    ) -> LiveCursor {
        LiveCursor {
            core,
            name,
            from,
            chunk_bytes,
            keep_alive_ms: keep_alive_ms.max(KEEP_ALIVE_MIN_MS),
            deadline: Instant::now() + Duration::from_millis(max_duration_ms),
            done: false,
            last_round: false,
            queue: ReadyEvents::default(),
            token_reloads: crate::auth::table_reloads(),
        }
    }

    /// Whether the token table was reloaded since the response started: what it read since
    /// is not sent, and it ends (its client is checked again when it reconnects).
    pub fn tokens_reloaded(&self) -> bool {
        crate::auth::table_reloads() != self.token_reloads
    }

    /// When the response's writes must be over ([`LiveEvents::deadline`]).
    pub fn write_deadline(&self) -> Instant {
        self.deadline + END_WRITE_GRACE
    }

    /// The next read: waiting for the round (`wait`) or answered at once; `None` once the
    /// response is over.
    pub fn next_read(&mut self, wait: bool) -> Option<ReadRequest> {
        if self.done {
            return None;
        }
        if self.tokens_reloaded() {
            self.done = true;
            return None;
        }
        let Some(round) = IdleRound::next(self.deadline, self.keep_alive_ms) else {
            self.done = true;
            return None;
        };
        self.last_round = round.last;
        Some(ReadRequest {
            from: self.from,
            max_records: limits::RECORDS_PER_READ_MAX,
            max_bytes: self.chunk_bytes,
            wait_ms: Some(if wait { round.wait_ms } else { 0 }),
            with_content_type: false,
            bound: None,
        })
    }
}

/// A live response's events, as the response's body.
pub type LiveBody = Box<dyn LiveEvents>;

/// How a live response encodes a batch into events, as far as the events depend on it: two
/// responses that encode the same batch the same way send the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventEncoding {
    /// A Pico `data` event and its `control` event (`pico/sse.rs`).
    Pico,
    /// A Durable Streams `data` event (`ds/sse.rs`): the records as a JSON array, base64 or
    /// text, the first one whole.
    Ds { json: bool, base64: bool },
}

/// The most encoded events a core keeps. Each is one read's worth (`--max-chunk-size`,
/// base64 aside); an event is only reused while the subscribers of its read are answered,
/// which is one after the other on this core, so a few cover the streams delivered at once.
const ENCODED_EVENTS_KEPT: usize = 8;

thread_local! {
    /// This core's last encoded events: (shared read, encoding, bytes), newest last. A shared
    /// read is named by its number, not grouped again: the engine formed it of the requests
    /// with one `pico_engine::ReadShape`, and every subscriber it answered, parked or driven
    /// by a task, holds a batch carrying that number.
    static ENCODED_EVENTS: RefCell<VecDeque<(u64, EventEncoding, Bytes)>> =
        const { RefCell::new(VecDeque::new()) };
}

/// The events of `batch` as `encode` makes them, made once per core for all the subscribers
/// of one shared live read (`ReadBatch::shared_read`): 10,000 subscribers of a stream would
/// otherwise encode the same records 10,000 times. A batch read alone is encoded for itself.
pub(crate) fn encoded_once(
    batch: &ReadBatch,
    encoding: EventEncoding,
    encode: impl FnOnce() -> Bytes,
) -> Bytes {
    let Some(read) = batch.shared_read else {
        return encode();
    };
    let kept = ENCODED_EVENTS.with_borrow(|events| {
        events
            .iter()
            .rev()
            .find(|(r, e, _)| *r == read && *e == encoding)
            .map(|(_, _, bytes)| bytes.clone())
    });
    if let Some(bytes) = kept {
        return bytes;
    }
    let bytes = encode();
    ENCODED_EVENTS.with_borrow_mut(|events| {
        if events.len() == ENCODED_EVENTS_KEPT {
            events.pop_front();
        }
        events.push_back((read, encoding, bytes.clone()));
    });
    bytes
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn batch(shared_read: Option<u64>) -> ReadBatch {
        ReadBatch {
            from: 0,
            records: Vec::new(),
            next_offset: 1,
            tail: 1,
            closed: false,
            content_type: None,
            inherit: None,
            shared_read,
        }
    }

    /// Encodes `batch` the `encoding` way through the memo, counting the encodings made.
    fn encode(batch: &ReadBatch, encoding: EventEncoding, made: &Cell<usize>) -> Bytes {
        encoded_once(batch, encoding, || {
            made.set(made.get() + 1);
            Bytes::from(format!("{:?} {encoding:?}", batch.shared_read))
        })
    }

    #[test]
    fn ready_events_leave_in_the_order_they_came() {
        let mut ready = ReadyEvents::default();
        assert!(ready.is_empty());
        ready.push(Bytes::from_static(b"a"));
        ready.push(Bytes::from_static(b"b"));
        assert_eq!(ready.pop().as_deref(), Some(&b"a"[..]));
        ready.push(Bytes::from_static(b"c"));
        ready.push(Bytes::from_static(b"d"));
        assert_eq!(ready.pop().as_deref(), Some(&b"b"[..]));
        assert_eq!(
            ready.pop().as_deref(),
            Some(&b"cd"[..]),
            "a third joins the second"
        );
        assert_eq!(ready.pop(), None);
        assert!(ready.is_empty());
    }

    #[test]
    fn a_shared_read_is_encoded_once_per_encoding() {
        let made = Cell::new(0);
        let ds = EventEncoding::Ds {
            json: true,
            base64: false,
        };
        let shared = batch(Some(u64::MAX - 1));
        for _ in 0..3 {
            assert_eq!(
                encode(&shared, ds, &made),
                "Some(18446744073709551614) Ds { json: true, base64: false }"
            );
        }
        assert_eq!(
            made.get(),
            1,
            "the subscribers of one read share its encoding"
        );
        encode(&shared, EventEncoding::Pico, &made);
        encode(
            &shared,
            EventEncoding::Ds {
                json: false,
                base64: true,
            },
            &made,
        );
        assert_eq!(made.get(), 3, "each encoding is its own");
        for _ in 0..2 {
            encode(&batch(None), ds, &made);
        }
        assert_eq!(made.get(), 5, "a read answered alone is encoded for itself");
        // Only the last few are kept: the oldest goes first.
        for read in 0..ENCODED_EVENTS_KEPT as u64 {
            encode(&batch(Some(read)), ds, &made);
        }
        let made_before = made.get();
        encode(&shared, ds, &made);
        assert_eq!(made.get(), made_before + 1, "an old one is made again");
        encode(&batch(Some(ENCODED_EVENTS_KEPT as u64 - 1)), ds, &made);
        assert_eq!(made.get(), made_before + 1, "a recent one is kept");
        ENCODED_EVENTS.with_borrow(|events| assert!(events.len() <= ENCODED_EVENTS_KEPT));
    }

    /// What every SSE subscriber holds between reads (thousands wait at once, parked as this
    /// state, `transport/http1/parked.rs`), in both protocols.
    #[test]
    fn a_subscriber_between_reads_holds_a_small_state() {
        // 184 and 152 bytes when written; a waiting subscriber that is a connection task
        // holds an 888-byte read future and a 152-byte state besides.
        for (protocol, bytes) in [
            ("Durable Streams", crate::ds::STATE_BYTES),
            ("Pico", crate::pico::STATE_BYTES),
        ] {
            assert!(
                bytes <= 256,
                "a {protocol} subscriber's state takes {bytes} bytes"
            );
        }
    }
}
