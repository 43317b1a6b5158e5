//! The one driver of a live (SSE) response, both protocols, on every transport: it takes the
//! events the response has ready, has its transport write them, and makes the response's next
//! read, until the response ends or waits at the tail where its connection can be parked.
//!
//! A transport implements only how its bytes leave: [`EventFrames`] (how an event is framed:
//! a chunk of a chunked body over HTTP/1.1, a DATA frame's payload over HTTP/2) and
//! [`EventWriter`] (writing them, noticing the peer is gone, ending the body). A task drives
//! a response with [`drive`] over HTTP/1.1 (plain or TLS, `http1/write.rs`) and HTTP/2
//! (`http2.rs`). Parked subscribers (`http1/parked.rs`) are driven the same way without a
//! task each: their group makes the read, and each member takes the same steps
//! ([`stage_ready`], then [`tail_read`]) with a socket written to without waiting.
//!
//! Long-polls need no driver: a long-poll is one read and one response, answered by its
//! protocol's handler; what it shares with SSE is the engine's shared read
//! (`pico_engine::ReadShape`).

use std::io;

use bytes::Bytes;
use pico_engine::ReadShape;

use crate::live_response::{live_read, LiveBody};
use crate::transport::message::{by_deadline, SomeOf};

/// Events that are ready at once are written together up to about this many bytes: an SSE
/// data event and the control event behind it are one write, one TCP segment and one wake-up
/// of the client instead of two (10,000 subscribers on one stream pay this per record;
/// docs/decisions/2026-12-shared-live-reads.md).
const COALESCED_EVENTS_BYTES_MAX: usize = 64 * 1024;

/// How a transport frames the events of a live response for its next write.
pub(crate) trait EventFrames {
    /// Adds `event` to what the next write sends, framed for this transport (an empty event
    /// adds nothing).
    fn stage(&mut self, event: Bytes);
    /// The bytes staged for the next write.
    fn staged(&self) -> usize;
}

/// How a transport writes a live response; the rest of driving it is [`drive`]'s.
pub(crate) trait EventWriter: EventFrames {
    /// Writes everything staged; the staging is empty afterwards.
    async fn send(&mut self) -> io::Result<()>;
    /// Ends the response's body (the last chunk; HTTP/2's end of stream).
    async fn end(&mut self) -> io::Result<()>;
    /// Resolves once the peer left (it closed the connection or reset the stream) or sent
    /// bytes the connection must read: a response waiting for its next read ends then, and
    /// the read waiting under it is dropped at once, not at the next keep-alive.
    async fn peer_gone(&mut self);
    /// Whether nothing the peer sent waits to be read: only then may the connection be
    /// parked (a parked connection's bytes would wake it again at once).
    fn quiet(&self) -> bool;
    /// Bytes written that the transport still holds unsent (a TCP socket's send queue the
    /// peer's window has not admitted); 0 where it cannot tell, or where the transport's own
    /// flow control stalls the writes themselves (HTTP/2).
    fn unsent(&self) -> usize {
        0
    }
}

/// The longest pause between two looks at a socket that still holds a response's last bytes.
const SENT_OFF_PAUSE_MAX_MS: u64 = 100;

/// Resolves once `writer`'s transport holds nothing unsent: at once for a reader that takes
/// its bytes, else by looking again after growing pauses (1 ms, doubling, at most
/// [`SENT_OFF_PAUSE_MAX_MS`]). Bounded by its caller's deadline.
async fn sent_off(writer: &impl EventWriter) -> io::Result<()> {
    let mut pause_ms = 1;
    while writer.unsent() > 0 {
        glommio::timer::sleep(std::time::Duration::from_millis(pause_ms)).await;
        pause_ms = (pause_ms * 2).min(SENT_OFF_PAUSE_MAX_MS);
    }
    Ok(())
}

/// How driving a live response ended.
pub(crate) enum Driven {
    /// The response is over, its end written.
    Ended,
    /// It waits at the tail with nothing left to send and the peer quiet: the connection may
    /// be parked (only with `parkable`).
    AtTail,
}

/// Stages the events `live` has ready in `frames` while fewer than `max_bytes` are staged;
/// whether any bytes were staged.
pub(crate) fn stage_ready(
    live: &mut LiveBody,
    frames: &mut impl EventFrames,
    max_bytes: usize,
) -> bool {
    let before = frames.staged();
    while frames.staged() < max_bytes {
        match live.pop_event() {
            Some(event) => frames.stage(event),
            None => break,
        }
    }
    frames.staged() > before
}

/// The read `live` makes next if it waits at the tail with nothing to send, as a group of
/// parked subscribers shares it: its shape and how long it waits. `None`: it does not wait
/// at the tail, its read cannot be shared, or the response is over; a task drives it then.
pub(crate) fn tail_read(live: &mut LiveBody) -> Option<(ReadShape, u64)> {
    if !live.at_tail() {
        return None;
    }
    let request = live.next_read()?;
    Some((ReadShape::of(&request)?, request.wait_ms.unwrap_or(0)))
}

/// Drives `live` on `writer`: what is staged first, then each set of ready events as one
/// write, then its next read, until the response ends ([`Driven::Ended`], its end written) or,
/// with `parkable`, waits at the tail ([`Driven::AtTail`]). An error ends the response: a
/// write that failed, did not finish by the response's deadline (a reader that stopped
/// reading is not held past its end), or a peer that left while it waited. A response with a
/// deadline is over only once its bytes left the socket, not when the socket took them: a
/// reader that stopped reading leaves the end of the response in the send queue (a write
/// that does not wait fills the queue further than one that waits for room), and its
/// connection must close at the deadline rather than wait for a next request.
///
/// `stirred`: the connection was handed back because its peer sent bytes or hung up while
/// parked; it does not park again before its next read has watched the peer (reading those
/// bytes, or seeing the hang-up), or the watch would wake it again at once.
pub(crate) async fn drive<W: EventWriter>(
    live: &mut LiveBody,
    writer: &mut W,
    parkable: bool,
    stirred: bool,
) -> io::Result<Driven> {
    let mut may_park = parkable && !stirred;
    let deadline = live.deadline();
    loop {
        if writer.staged() > 0 || stage_ready(live, writer, COALESCED_EVENTS_BYTES_MAX) {
            by_deadline(deadline, writer.send()).await?;
            continue;
        }
        if may_park && writer.quiet() && live.at_tail() {
            return Ok(Driven::AtTail);
        }
        let Some(request) = live.next_read() else {
            by_deadline(deadline, writer.end()).await?;
            if deadline.is_some() {
                by_deadline(deadline, sent_off(writer)).await?;
            }
            return Ok(Driven::Ended);
        };
        // Boxed: a task that drives its response holds the read's room only while it reads.
        let read = Box::pin(live_read(live.core(), live.stream_name(), &request));
        let read = futures_lite::future::or(SomeOf { future: read }, async {
            writer.peer_gone().await;
            None
        })
        .await;
        let Some(read) = read else {
            return Err(io::ErrorKind::ConnectionAborted.into());
        };
        live.answer(read.as_ref());
        may_park = parkable;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::rc::Rc;

    use pico_engine::{CoreHandle, ReadBatch, ReadFrom, ReadRequest};

    use super::*;
    use crate::live_response::LiveEvents;

    /// Queued events, then one read of `next`, without a core.
    struct Scripted {
        events: VecDeque<Bytes>,
        next: Option<ReadRequest>,
        deadline: Option<std::time::Instant>,
    }

    impl LiveEvents for Scripted {
        fn core(&self) -> &Rc<CoreHandle> {
            unreachable!("the steps make no read")
        }
        fn stream_name(&self) -> &str {
            "/scripted"
        }
        fn pop_event(&mut self) -> Option<Bytes> {
            self.events.pop_front()
        }
        fn next_read(&mut self) -> Option<ReadRequest> {
            self.next.clone()
        }
        fn answer(&mut self, _: Option<&(ReadBatch, bool)>) {}
        fn at_tail(&self) -> bool {
            self.events.is_empty() && self.next.is_some()
        }
        fn deadline(&self) -> Option<std::time::Instant> {
            self.deadline
        }
    }

    /// Events staged as they are, counted by their bytes.
    #[derive(Default)]
    struct Staged(Vec<Bytes>);

    impl EventFrames for Staged {
        fn stage(&mut self, event: Bytes) {
            self.0.push(event);
        }
        fn staged(&self) -> usize {
            self.0.iter().map(Bytes::len).sum()
        }
    }

    fn read_at(from: ReadFrom, wait_ms: u64) -> ReadRequest {
        ReadRequest {
            from,
            max_records: 10,
            max_bytes: 1000,
            wait_ms: Some(wait_ms),
            with_content_type: false,
            bound: None,
        }
    }

    #[test]
    fn ready_events_are_staged_up_to_the_limit_then_the_tail_read_is_shared_by_shape() {
        let big = Bytes::from(vec![b'x'; COALESCED_EVENTS_BYTES_MAX]);
        let mut live: LiveBody = Box::new(Scripted {
            events: [big, Bytes::from_static(b"control")].into(),
            next: Some(read_at(ReadFrom::Offset(7), 250)),
            deadline: None,
        });
        let mut staged = Staged::default();
        assert!(stage_ready(
            &mut live,
            &mut staged,
            COALESCED_EVENTS_BYTES_MAX
        ));
        assert_eq!(staged.0.len(), 1, "a full write takes no more events");
        assert_eq!(tail_read(&mut live), None, "an event is still to be sent");
        assert!(stage_ready(&mut live, &mut Staged::default(), usize::MAX));
        assert!(
            !stage_ready(&mut live, &mut staged, usize::MAX),
            "none left"
        );
        let (shape, wait_ms) = tail_read(&mut live).expect("waits at the tail");
        assert_eq!(wait_ms, 250);
        assert_eq!(
            shape,
            ReadShape::of(&read_at(ReadFrom::Offset(7), 0)).unwrap()
        );
        assert_eq!(shape.request(250), read_at(ReadFrom::Offset(7), 250));
        // A read from the tail is resolved by the engine first: no group shares it.
        let mut from_tail: LiveBody = Box::new(Scripted {
            events: VecDeque::new(),
            next: Some(read_at(ReadFrom::Tail, 250)),
            deadline: None,
        });
        assert_eq!(tail_read(&mut from_tail), None);
    }

    /// A transport whose writes all succeed at once, and whose socket holds what they wrote
    /// unsent for its first `held_looks` looks (forever with `usize::MAX`).
    #[derive(Default)]
    struct Holding {
        staged: Staged,
        written: usize,
        held_looks: std::cell::Cell<usize>,
    }

    impl EventFrames for Holding {
        fn stage(&mut self, event: Bytes) {
            self.staged.stage(event);
        }
        fn staged(&self) -> usize {
            self.staged.staged()
        }
    }

    impl EventWriter for Holding {
        async fn send(&mut self) -> io::Result<()> {
            self.written += std::mem::take(&mut self.staged.0).len();
            Ok(())
        }
        async fn end(&mut self) -> io::Result<()> {
            self.written += 1;
            Ok(())
        }
        async fn peer_gone(&mut self) {
            futures_lite::future::pending::<()>().await;
        }
        fn quiet(&self) -> bool {
            true
        }
        fn unsent(&self) -> usize {
            let left = self.held_looks.get();
            self.held_looks.set(left.saturating_sub(1));
            usize::from(left > 0)
        }
    }

    /// Drives a response of one event that is over once sent, its deadline `deadline_ms`
    /// away (none with `None`), on a socket holding its bytes for `held_looks` looks.
    fn drive_held(deadline_ms: Option<u64>, held_looks: usize) -> io::Result<()> {
        glommio::LocalExecutor::default().run(async move {
            let deadline = deadline_ms
                .map(|ms| std::time::Instant::now() + std::time::Duration::from_millis(ms));
            let mut live: LiveBody = Box::new(Scripted {
                events: [Bytes::from_static(b"data")].into(),
                next: None,
                deadline,
            });
            let mut writer = Holding {
                held_looks: held_looks.into(),
                ..Holding::default()
            };
            let driven = drive(&mut live, &mut writer, false, false).await?;
            assert!(matches!(driven, Driven::Ended));
            assert_eq!(writer.written, 2, "the event and the end");
            Ok(())
        })
    }

    /// A live response with a deadline is over when its socket has sent its bytes, not when
    /// it took them: a reader that stopped reading leaves them in the socket, and the response
    /// then fails at its deadline (its connection closes) instead of ending cleanly.
    #[test]
    fn a_response_is_over_once_its_socket_has_sent_it() {
        assert_eq!(drive_held(Some(60_000), 0).map_err(|e| e.kind()), Ok(()));
        // Sent off after a few looks (1, 2, 4 ms apart): ended.
        assert_eq!(drive_held(Some(60_000), 3).map_err(|e| e.kind()), Ok(()));
        // Never sent off: the deadline fails it.
        assert_eq!(
            drive_held(Some(300), usize::MAX).map_err(|e| e.kind()),
            Err(io::ErrorKind::TimedOut)
        );
        // Without a deadline, the socket taking the bytes is enough.
        assert_eq!(drive_held(None, usize::MAX).map_err(|e| e.kind()), Ok(()));
    }
}
