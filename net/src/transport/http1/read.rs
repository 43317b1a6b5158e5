//! Reading from an HTTP/1.1 connection's socket into its buffer: idle waits that hold no
//! buffer, reads while a request arrives, and noticing a peer that left mid-request.

use bytes::BytesMut;
use futures_lite::AsyncRead;
use tokio::io::ReadBuf;

use crate::limits::HEAD_BYTES_MAX;
use crate::transport::socket::Socket;

/// Bytes asked of the socket per read while a request arrives.
pub(super) const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Bytes asked of the socket by the first read of a connection and between requests: most
/// request heads (and small bodies) fit. Read through a stack scratch, so an idle
/// connection holds no buffer; the larger reads start once a request is arriving.
const IDLE_READ_BYTES: usize = 4 * 1024;
/// While a request is handled: each read of what the peer sends meanwhile (a pipelined
/// request, or nothing until it closes) takes at most this much.
const PEER_READ_BYTES: usize = 2 * 1024;
/// The stack scratch of [`read_arriving`]: the most one of its reads takes.
const ARRIVING_READ_BYTES_MAX: usize = 4 * 1024;

/// Completes when the peer closes the connection (or it fails) while a request is handled;
/// bytes it sends meanwhile (a pipelined next request) are kept in `buf`, up to a request
/// head's worth, after which it stops reading. Cancel-safe: bytes are moved into `buf` in the
/// poll that reads them.
pub(super) async fn peer_gone<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) {
    while buf.len() < HEAD_BYTES_MAX {
        match read_arriving(stream, buf, PEER_READ_BYTES).await {
            Ok(false) | Err(_) => return,
            Ok(true) => {}
        }
    }
    std::future::pending::<()>().await
}

/// Waits for the next bytes of a connection that holds no room for them: each poll reads
/// into its thread's scratch array (for that poll only, never part of a future) and only
/// bytes that arrived are appended to `buf`. So a connection waiting for its next request, or
/// for its client to leave during a long-poll or an SSE response, holds no buffer at all
/// (thousands wait at once). Cancel-safe: `buf` changes only in the poll that read. `false`
/// at end of stream.
async fn read_arriving<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    most: usize,
) -> std::io::Result<bool> {
    let room = most.min(ARRIVING_READ_BYTES_MAX);
    std::future::poll_fn(|cx| {
        let mut poll_into = |scratch: &mut [u8]| match std::pin::Pin::new(&mut *stream)
            .poll_read(cx, &mut scratch[..room])
        {
            std::task::Poll::Ready(Ok(n)) => {
                buf.extend_from_slice(&scratch[..n]);
                std::task::Poll::Ready(Ok(n > 0))
            }
            std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
            std::task::Poll::Pending => std::task::Poll::Pending,
        };
        ARRIVING_SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => poll_into(&mut scratch[..]),
            // Only a read inside another's poll would find it taken; it gets its own.
            Err(_) => poll_into(&mut [0u8; ARRIVING_READ_BYTES_MAX]),
        })
    })
    .await
}

thread_local! {
    /// [`read_arriving`]'s scratch, one per thread (a core's connections take turns with it),
    /// zeroed once: zeroing 4 KiB at every poll, twice a request, would be a quarter of a small
    /// append's user-space instructions. Only the bytes a read put in it are ever copied out.
    static ARRIVING_SCRATCH: std::cell::RefCell<Box<[u8; ARRIVING_READ_BYTES_MAX]>> =
        std::cell::RefCell::new(Box::new([0; ARRIVING_READ_BYTES_MAX]));
}

/// Fills `buf` with at least one more chunk from the socket; `false` at end of stream.
pub(super) async fn fill<S: Socket>(stream: &mut S, buf: &mut BytesMut) -> std::io::Result<bool> {
    read_into(stream, buf, READ_CHUNK_BYTES).await
}

/// Waits for the next bytes of an idle connection, holding no buffer meanwhile: the previous
/// request's buffer is let go first.
pub(super) async fn fill_idle<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> std::io::Result<bool> {
    if buf.is_empty() && buf.capacity() > 0 {
        *buf = BytesMut::new();
    }
    read_arriving(stream, buf, IDLE_READ_BYTES).await
}

/// Reads at most `room` more bytes onto the end of `buf`, straight into its spare capacity
/// (not zeroed first where the socket can read into uninitialized memory:
/// [`Socket::poll_read_buf`]); `false` at end of stream. Cancel-safe: `buf` grows only in the
/// poll that read.
async fn read_into<S: Socket>(
    stream: &mut S,
    buf: &mut BytesMut,
    room: usize,
) -> std::io::Result<bool> {
    buf.reserve(room);
    let len = buf.len();
    let mut spare = ReadBuf::uninit(&mut buf.spare_capacity_mut()[..room]);
    std::future::poll_fn(|cx| stream.poll_read_buf(cx, &mut spare)).await?;
    let read = spare.filled().len();
    // SAFETY: a `ReadBuf`'s filled part is initialized, and it is the first `read` bytes of
    // `buf`'s spare capacity, right after its `len` bytes.
    unsafe { buf.set_len(len + read) };
    Ok(read > 0)
}

/// Reads into `buf`'s spare capacity (at most one read's worth) without growing it; `false`
/// at end of stream.
pub(super) async fn fill_spare<S: Socket>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> std::io::Result<bool> {
    let room = (buf.capacity() - buf.len()).min(READ_CHUNK_BYTES);
    read_into(stream, buf, room).await
}
