//! The byte streams connections run on (plain TCP, or TLS over it), and the bridge from them
//! to the tokio I/O traits that `h2` drives.
//!
//! Plain TCP takes vectored writes (`sendmsg` with several buffers): `h2` then sends a DATA
//! frame's 9-byte header and its payload in one system call and one TCP segment, instead of
//! copying the payload's first KiB behind the header and writing twice. That halves the
//! segments a large response is cut into, which the reader pays for as much as the server.

use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use tokio::io::ReadBuf;

use super::readiness::Registration;

/// At most this many buffers go into one `sendmsg` (well under `IOV_MAX`).
const IOVECS_PER_SEND_MAX: usize = 64;

/// A connection's byte stream.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + 'static {
    /// Whether `poll_write_vectored` sends several buffers in one call (otherwise it writes
    /// only the first, and callers do better copying small pieces together themselves).
    fn vectored(&self) -> bool {
        false
    }

    /// Whether a live response waiting at the tail may leave its connection's task for the
    /// core's parked subscribers (which write to the socket's descriptor themselves:
    /// `transport/http1/parked.rs`). Not over TLS, whose records only the task can write.
    fn parkable(&self) -> bool {
        false
    }

    /// A write that makes no progress for `timeout` fails (`TimedOut`), and with it the
    /// connection: glommio's write timer, armed only while a write waits for room in the
    /// socket and disarmed by the next write that sends anything.
    fn set_send_stall_timeout(&self, timeout: std::time::Duration);

    /// Bytes written to the socket that it has not sent yet: the peer's receive window is
    /// full (a reader that stopped reading) or the network is slow. 0 where it cannot tell.
    fn unsent_bytes(&self) -> usize {
        0
    }

    /// Reads what the socket has into `buf`'s unfilled part, which need not be initialized.
    /// This default initializes it first (zeroing the part never written) and reads through
    /// `poll_read`; a plain TCP socket that waits through the core's `epoll` instance reads
    /// straight into it, so a body's 64 KiB buffer is not zeroed before each read only to be
    /// overwritten (5 % of a 64 KiB append's CPU).
    fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        read_buf_initialized(self, cx, buf)
    }
}

/// [`Socket::poll_read_buf`] through `poll_read`, over the initialized (zeroed where needed)
/// unfilled part of `buf`.
fn read_buf_initialized<S: AsyncRead + Unpin + ?Sized>(
    socket: &mut S,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    let unfilled = buf.initialize_unfilled();
    let read = std::task::ready!(Pin::new(socket).poll_read(cx, unfilled))?;
    buf.advance(read);
    Poll::Ready(Ok(()))
}

/// The bytes a TCP socket holds that it has not sent (`SIOCOUTQNSD`: written, not yet sent;
/// sent and unacknowledged bytes are not counted). 0 if the kernel cannot tell.
fn tcp_unsent_bytes(stream: &TcpStream) -> usize {
    let mut unsent: libc::c_int = 0;
    // SAFETY: the descriptor is the stream's, open while it is borrowed; the call writes one
    // int into `unsent`.
    let asked = unsafe { libc::ioctl(stream.as_raw_fd(), libc::SIOCOUTQNSD, &mut unsent) };
    if asked < 0 {
        return 0;
    }
    usize::try_from(unsent).unwrap_or(0)
}

impl Socket for futures_rustls::server::TlsStream<TcpStream> {
    fn set_send_stall_timeout(&self, timeout: std::time::Duration) {
        // rustls writes its records through the TCP stream's own `poll_write`.
        let _ = self.get_ref().0.set_write_timeout(Some(timeout));
    }

    fn unsent_bytes(&self) -> usize {
        // Each write is flushed: rustls's records are in the TCP socket by then.
        tcp_unsent_bytes(self.get_ref().0)
    }
}

/// An accepted plain TCP connection.
pub struct PlainTcp {
    /// How reads wait for bytes. Declared before `stream`: a registration leaves the core's
    /// `epoll` instance while the descriptor is still open.
    reads: ReadPath,
    stream: TcpStream,
    /// glommio's last write waited for room: its write timer may be armed, and only a write
    /// through glommio disarms it, so the next write goes that way (not `sendmsg`). Else a
    /// timer left armed by a wait that `sendmsg` then ended would fail a later wait early.
    stalled: bool,
}

impl PlainTcp {
    pub fn new(stream: TcpStream) -> PlainTcp {
        PlainTcp {
            reads: ReadPath::Unregistered,
            stream,
            stalled: false,
        }
    }

    /// How reads wait for bytes, registering the socket with the core's `epoll` instance at
    /// its first read.
    fn read_path(&mut self) -> &ReadPath {
        if let ReadPath::Unregistered = self.reads {
            self.reads = match Registration::new(self.stream.as_raw_fd()) {
                Some(registration) => ReadPath::Epoll(registration),
                None => ReadPath::Glommio,
            };
        }
        &self.reads
    }

    /// A write of `buf` through glommio's socket (its send stall timer included).
    fn poll_write_glommio(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.stalled = written.is_pending();
        written
    }

    /// The connection as its bare descriptor, for a parked connection to keep without
    /// glommio's stream or this core's readiness entry. glommio's stream cannot give its
    /// descriptor up, so it is duplicated and the stream closes its own.
    pub(crate) fn into_fd(self) -> io::Result<std::os::fd::OwnedFd> {
        // SAFETY: the descriptor is the stream's, open for as long as `self`, which outlives
        // the borrow.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.stream.as_raw_fd()) };
        fd.try_clone_to_owned()
    }

    /// A connection again from the descriptor [`PlainTcp::into_fd`] gave.
    pub(crate) fn from_fd(fd: std::os::fd::OwnedFd) -> PlainTcp {
        use std::os::fd::{FromRawFd, IntoRawFd};
        // SAFETY: the descriptor is an open TCP socket this process owns, and ownership moves
        // to the stream (nothing else closes it).
        PlainTcp::new(unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) })
    }
}

impl Socket for PlainTcp {
    fn vectored(&self) -> bool {
        true
    }

    fn parkable(&self) -> bool {
        true
    }

    fn set_send_stall_timeout(&self, timeout: std::time::Duration) {
        let _ = self.stream.set_write_timeout(Some(timeout));
    }

    fn unsent_bytes(&self) -> usize {
        tcp_unsent_bytes(&self.stream)
    }

    fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let ReadPath::Epoll(registration) = self.read_path() {
            // SAFETY: the socket only writes bytes into the unfilled part (`recv`), never
            // de-initializes any.
            let unfilled = unsafe { buf.unfilled_mut() };
            match registration.poll_read_uninit(cx, unfilled) {
                Some(Poll::Ready(Ok(read))) => {
                    // SAFETY: `recv` wrote `read` bytes at the start of the unfilled part.
                    unsafe { buf.assume_init(read) };
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                Some(Poll::Ready(Err(error))) => return Poll::Ready(Err(error)),
                Some(Poll::Pending) => return Poll::Pending,
                None => self.reads = ReadPath::Glommio,
            }
        }
        read_buf_initialized(self, cx, buf)
    }
}

/// How a [`PlainTcp`] waits for bytes (`transport/readiness.rs`).
enum ReadPath {
    /// Not waited yet: registered at the first read.
    Unregistered,
    /// Through the core's `epoll` instance.
    Epoll(Registration),
    /// Through glommio's poll of the socket (the core has no instance, or its watch failed).
    Glommio,
}

impl AsyncRead for PlainTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let ReadPath::Epoll(registration) = this.read_path() {
            match registration.poll_read(cx, buf) {
                Some(read) => return read,
                None => this.reads = ReadPath::Glommio,
            }
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for PlainTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_glommio(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let count = bufs.len().min(IOVECS_PER_SEND_MAX);
        if count > 1 && !self.stalled {
            // SAFETY: an all-zero msghdr is valid (no address, no control data).
            let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
            // `IoSlice` is ABI-compatible with `iovec` on Unix; sendmsg only reads them.
            message.msg_iov = bufs.as_ptr() as *mut libc::iovec;
            message.msg_iovlen = count as _;
            loop {
                // SAFETY: `message` points at `count` live buffers borrowed for this call.
                let sent = unsafe {
                    libc::sendmsg(
                        self.stream.as_raw_fd(),
                        &message,
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
                if sent >= 0 {
                    return Poll::Ready(Ok(sent as usize));
                }
                let error = io::Error::last_os_error();
                match error.kind() {
                    io::ErrorKind::Interrupted => continue,
                    // A full socket: glommio's own write path waits for room (and may find
                    // it already, writing the first buffer).
                    io::ErrorKind::WouldBlock => break,
                    _ => return Poll::Ready(Err(error)),
                }
            }
        }
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        self.poll_write_glommio(cx, first)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_close(cx)
    }
}

/// A [`Socket`] seen through tokio's I/O traits (what `h2` is written against), passing
/// vectored writes through when the socket takes them.
pub struct TokioIo<S> {
    inner: S,
}

impl<S: Socket> TokioIo<S> {
    pub fn new(inner: S) -> TokioIo<S> {
        TokioIo { inner }
    }
}

impl<S: Socket> tokio::io::AsyncRead for TokioIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.inner.poll_read_buf(cx, buf)
    }
}

impl<S: Socket> tokio::io::AsyncWrite for TokioIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}
