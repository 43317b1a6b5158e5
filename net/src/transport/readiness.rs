//! Readiness of a core's plain TCP sockets for reading, from one `epoll` instance per core.
//!
//! glommio waits for a socket's bytes with one io_uring poll per wait: a submission, a poll
//! armed in the kernel and torn down again, a completion, and a source allocated and freed,
//! once per request on a keep-alive connection (BENCHMARKS.md, "W1-W3": about a tenth of a
//! small append's CPU). Here a socket is added to the core's `epoll` instance once, edge
//! triggered, when it first waits; after that a new arrival only puts it on the instance's
//! ready list, and one task takes the whole list per wake-up (`epoll_wait`) and wakes the
//! connections that wait.
//!
//! A socket is *ready* while it may have bytes: from its registration, and again at each event
//! reported for it. A read that finds nothing (`EAGAIN`), or that returns fewer bytes than it
//! asked for (the kernel's receive queue was emptied: the rule tokio reads TCP by), marks it
//! not ready, and the next read waits for an event instead of asking the kernel. Bytes that
//! arrive after such a read always raise an event (edge triggered: each arrival does), so a
//! wait is never missed; an event for bytes a read already took only costs one `EAGAIN`.
//!
//! A core that cannot make the instance, or whose watch fails, reads through glommio.

use std::cell::{Cell, RefCell};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use slab::Slab;

/// The most readiness events taken from the `epoll` instance per wake-up.
const EVENTS_PER_WAKE_MAX: usize = 128;

thread_local! {
    /// This core's instance, made on the first wait (`None` if it cannot be made), with the
    /// executor whose task watches it: a thread that runs another executor later (tests do)
    /// gets a new one.
    static READINESS: RefCell<Option<(usize, Option<Rc<Readiness>>)>> = const { RefCell::new(None) };
}

/// This thread's executor's instance, made on first use.
fn this_core() -> Option<Rc<Readiness>> {
    let executor = glommio::executor().id();
    READINESS.with(|cell| {
        let mut cell = cell.borrow_mut();
        match &*cell {
            Some((made_for, readiness)) if *made_for == executor => readiness.clone(),
            _ => {
                let readiness = Readiness::start();
                *cell = Some((executor, readiness.clone()));
                readiness
            }
        }
    })
}

struct Readiness {
    epoll: OwnedFd,
    sockets: RefCell<Slab<Socket>>,
    /// The watch task failed: every registration reads through glommio from now on.
    failed: Cell<bool>,
}

struct Socket {
    /// May have bytes to read (see the module's comment).
    ready: bool,
    /// The task waiting for bytes, woken at the next event.
    waiter: Option<Waker>,
}

/// A new `epoll` instance (this module's, and the parked subscribers' in `http1/parked.rs`).
pub(crate) fn epoll_instance() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the descriptor it returns is owned below.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epoll < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(epoll) })
}

/// Waits until `epoll` has events, then takes up to `events.len()` of them without waiting:
/// one poll through the core's ring per wake-up. More stay on its ready list, and it is
/// readable again at once.
pub(crate) async fn next_events<'a>(
    epoll: &OwnedFd,
    events: &'a mut [libc::epoll_event],
) -> io::Result<&'a [libc::epoll_event]> {
    glommio::net::poll_readable(epoll.as_raw_fd()).await?;
    let room = i32::try_from(events.len()).unwrap_or(i32::MAX);
    // SAFETY: `events` has room for the count given; the call does not wait.
    let reported = unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), room, 0) };
    Ok(&events[..usize::try_from(reported).unwrap_or(0)])
}

impl Readiness {
    fn start() -> Option<Rc<Readiness>> {
        let epoll = match epoll_instance() {
            Ok(epoll) => epoll,
            Err(e) => {
                log::warn!("socket reads wait through glommio on this core (epoll_create1: {e})");
                return None;
            }
        };
        let readiness = Rc::new(Readiness {
            epoll,
            sockets: RefCell::default(),
            failed: Cell::new(false),
        });
        glommio::spawn_local(watch(readiness.clone())).detach();
        Some(readiness)
    }

    /// The watch failed: every registration reads through glommio from now on, and every
    /// waiting task tries again (and goes there).
    fn fail(&self) {
        self.failed.set(true);
        let waiters: Vec<Waker> = self
            .sockets
            .borrow_mut()
            .iter_mut()
            .filter_map(|(_, s)| s.waiter.take())
            .collect();
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// Takes the instance's events as they come and wakes the sockets' waiting tasks.
async fn watch(readiness: Rc<Readiness>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAKE_MAX];
    let mut woken = Vec::new();
    loop {
        let reported = match next_events(&readiness.epoll, &mut events).await {
            Ok(reported) => reported,
            Err(e) => {
                log::error!("socket readiness watch failed, reads wait through glommio: {e}");
                readiness.fail();
                return;
            }
        };
        let mut sockets = readiness.sockets.borrow_mut();
        for event in reported {
            // A socket leaves the instance before its entry goes, so the key is its own.
            if let Some(socket) = usize::try_from(event.u64)
                .ok()
                .and_then(|key| sockets.get_mut(key))
            {
                socket.ready = true;
                woken.extend(socket.waiter.take());
            }
        }
        drop(sockets);
        woken.drain(..).for_each(Waker::wake);
    }
}

/// A socket in its core's `epoll` instance, until dropped (which takes it out: drop it while
/// the descriptor is still open).
pub(crate) struct Registration {
    readiness: Rc<Readiness>,
    /// The socket's entry (32 bits: with the descriptor, one word in every connection's task).
    key: u32,
    fd: RawFd,
}

impl Registration {
    /// Adds `fd` (a non-blocking socket) to this core's instance; `None` if this core reads
    /// through glommio.
    pub(crate) fn new(fd: RawFd) -> Option<Registration> {
        let readiness = this_core()?;
        if readiness.failed.get() {
            return None;
        }
        let mut sockets = readiness.sockets.borrow_mut();
        let entry = sockets.vacant_entry();
        // A core holds far fewer connections (`CONNECTIONS_PER_CORE_MAX`).
        let key = u32::try_from(entry.key()).ok()?;
        entry.insert(Socket {
            ready: true,
            waiter: None,
        });
        drop(sockets);
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: u64::from(key),
        };
        // SAFETY: both descriptors are open; `event` is read during the call only.
        let added = unsafe {
            libc::epoll_ctl(
                readiness.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd,
                &mut event,
            )
        };
        if added < 0 {
            log::warn!(
                "a socket reads through glommio (epoll_ctl: {})",
                io::Error::last_os_error()
            );
            readiness.sockets.borrow_mut().remove(key as usize);
            return None;
        }
        Some(Registration { readiness, key, fd })
    }

    /// Reads what the socket has into `buf`, or waits for an event. `None`: the watch failed,
    /// read through glommio.
    pub(crate) fn poll_read(
        &self,
        cx: &Context<'_>,
        buf: &mut [u8],
    ) -> Option<Poll<io::Result<usize>>> {
        // SAFETY: `buf` is valid for writes of its length for the call.
        unsafe { self.poll_recv(cx, buf.as_mut_ptr(), buf.len()) }
    }

    /// [`Registration::poll_read`] into memory that need not be initialized: on
    /// `Ready(Ok(n))` its first `n` bytes are.
    pub(crate) fn poll_read_uninit(
        &self,
        cx: &Context<'_>,
        buf: &mut [MaybeUninit<u8>],
    ) -> Option<Poll<io::Result<usize>>> {
        // SAFETY: `buf` is valid for writes of its length for the call; `recv` writes bytes
        // into it, it reads none.
        unsafe { self.poll_recv(cx, buf.as_mut_ptr().cast(), buf.len()) }
    }

    /// # Safety
    /// `buf` must be valid for writes of `len` bytes for the call.
    unsafe fn poll_recv(
        &self,
        cx: &Context<'_>,
        buf: *mut u8,
        len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        if self.readiness.failed.get() {
            return None;
        }
        if len == 0 {
            return Some(Poll::Ready(Ok(0)));
        }
        let mut sockets = self.readiness.sockets.borrow_mut();
        let socket = &mut sockets[self.key as usize];
        while socket.ready {
            // SAFETY: `buf` is valid for writes of `len` bytes (this function's contract).
            let read = unsafe { libc::recv(self.fd, buf.cast(), len, libc::MSG_DONTWAIT) };
            if read >= 0 {
                let read = read as usize;
                if read > 0 && read < len {
                    socket.ready = false;
                }
                return Some(Poll::Ready(Ok(read)));
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => socket.ready = false,
                _ => return Some(Poll::Ready(Err(error))),
            }
        }
        match &socket.waiter {
            Some(waiter) if waiter.will_wake(cx.waker()) => {}
            _ => socket.waiter = Some(cx.waker().clone()),
        }
        Some(Poll::Pending)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: both descriptors are open (the socket's owner drops this first); a null
        // event is allowed for a removal.
        unsafe {
            libc::epoll_ctl(
                self.readiness.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                self.fd,
                std::ptr::null_mut(),
            );
        }
        self.readiness
            .sockets
            .borrow_mut()
            .remove(self.key as usize);
    }
}

/// Sockets in this core's instance now (0 before its first wait).
#[cfg(test)]
fn registered_sockets() -> usize {
    READINESS.with(|cell| {
        cell.borrow()
            .as_ref()
            .and_then(|(_, r)| r.as_ref())
            .map_or(0, |r| r.sockets.borrow().len())
    })
}

/// Fails this core's watch as a failed poll would: waiting reads go to glommio.
#[cfg(test)]
fn fail_watch() {
    this_core().expect("the instance is made").fail();
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    use glommio::net::TcpListener;

    use super::*;
    use crate::transport::socket::PlainTcp;

    /// A listener on a free port of 127.0.0.1 and its address.
    fn listener() -> (TcpListener, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        (listener, addr)
    }

    /// `read`'s outcome, or a failure after 30 s: a lost wake-up fails the test instead of
    /// hanging it.
    async fn bounded<T>(read: impl std::future::Future<Output = T>) -> T {
        futures_lite::future::or(read, async {
            glommio::timer::sleep(Duration::from_secs(30)).await;
            panic!("a read was not woken within 30 s");
        })
        .await
    }

    /// A client on its own thread: `talk` gets the connected socket.
    fn client(
        addr: std::net::SocketAddr,
        talk: impl FnOnce(std::net::TcpStream) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let socket = std::net::TcpStream::connect(addr).expect("connect");
            socket
                .set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            talk(socket)
        })
    }

    #[test]
    fn messages_in_turns_are_read_in_turns_through_one_registration_that_leaves_with_the_socket() {
        glommio::LocalExecutor::default().run(async {
            let (listener, addr) = listener();
            let talking = client(addr, |mut socket| {
                let mut echo = [0u8; 16];
                for turn in 0..500u32 {
                    socket.write_all(&turn.to_be_bytes()).expect("send");
                    socket.read_exact(&mut echo[..4]).expect("echo");
                    assert_eq!(echo[..4], turn.to_be_bytes());
                }
            });
            let mut socket = PlainTcp::new(listener.accept().await.expect("accept"));
            let mut buf = [0u8; 64];
            for turn in 0..500u32 {
                // Each message is read whole: the client sends the next one after the echo.
                let mut got = 0;
                while got < 4 {
                    let n = socket.read(&mut buf[got..]).await.expect("read");
                    assert!(n > 0, "end of stream at turn {turn}");
                    got += n;
                }
                assert_eq!(buf[..4], turn.to_be_bytes());
                assert_eq!(registered_sockets(), 1);
                socket.write_all(&buf[..4]).await.expect("echo");
            }
            assert_eq!(
                socket.read(&mut buf).await.expect("read"),
                0,
                "end of stream"
            );
            talking.join().expect("client");
            drop(socket);
            assert_eq!(registered_sockets(), 0);
        });
    }

    #[test]
    fn reads_smaller_than_what_arrived_take_all_of_it_and_a_peer_that_leaves_ends_the_stream() {
        glommio::LocalExecutor::default().run(async {
            let (listener, addr) = listener();
            let sent: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            let expected = sent.clone();
            let talking = client(addr, move |mut socket| {
                socket.write_all(&sent).expect("send");
                // Leaves while the server waits for more.
            });
            let mut socket = PlainTcp::new(listener.accept().await.expect("accept"));
            let mut received = Vec::new();
            let mut buf = [0u8; 1000];
            loop {
                let n = socket.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                received.extend_from_slice(&buf[..n]);
            }
            assert_eq!(received.len(), expected.len());
            assert!(received == expected, "bytes differ");
            talking.join().expect("client");
        });
    }

    #[test]
    fn more_waiting_sockets_than_one_wake_up_takes_are_all_woken() {
        const SOCKETS: usize = EVENTS_PER_WAKE_MAX + 3;
        glommio::LocalExecutor::default().run(async {
            let (listener, addr) = listener();
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let talking = std::thread::spawn(move || {
                let mut sockets: Vec<_> = (0..SOCKETS)
                    .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
                    .collect();
                wait.recv().expect("every socket waits");
                for socket in &mut sockets {
                    socket.write_all(b"x").expect("send");
                }
                // Kept open until the server read every byte.
                wait.recv().expect("read");
            });
            let mut readers = Vec::new();
            for _ in 0..SOCKETS {
                let mut socket = PlainTcp::new(listener.accept().await.expect("accept"));
                readers.push(glommio::spawn_local(async move {
                    let mut buf = [0u8; 8];
                    socket.read(&mut buf).await.expect("read")
                }));
            }
            // Every reader finds nothing and waits.
            glommio::timer::sleep(Duration::from_millis(100)).await;
            assert_eq!(registered_sockets(), SOCKETS);
            go.send(()).expect("client");
            let started = Instant::now();
            for reader in readers {
                assert_eq!(bounded(reader).await, 1);
            }
            assert!(started.elapsed() < Duration::from_secs(30));
            go.send(()).expect("client");
            talking.join().expect("client");
            assert_eq!(registered_sockets(), 0);
        });
    }

    #[test]
    fn a_socket_given_up_as_a_descriptor_leaves_the_instance_and_reads_again_when_taken_back() {
        glommio::LocalExecutor::default().run(async {
            let (listener, addr) = listener();
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let talking = client(addr, move |mut socket| {
                socket.write_all(b"first").expect("send");
                wait.recv().expect("given up");
                socket.write_all(b"second").expect("send");
                wait.recv().expect("read");
            });
            let mut socket = PlainTcp::new(listener.accept().await.expect("accept"));
            let mut buf = [0u8; 16];
            let n = socket.read(&mut buf).await.expect("read");
            assert_eq!(&buf[..n], b"first");
            let fd = socket.into_fd().expect("descriptor");
            assert_eq!(registered_sockets(), 0);
            // The duplicate left in the instance would be reported under a key given to
            // another socket; none is.
            go.send(()).expect("client");
            let mut socket = PlainTcp::from_fd(fd);
            let n = socket.read(&mut buf).await.expect("read");
            assert_eq!(&buf[..n], b"second");
            assert_eq!(registered_sockets(), 1);
            go.send(()).expect("client");
            talking.join().expect("client");
        });
    }

    #[test]
    fn a_thread_that_runs_a_second_executor_watches_its_sockets_there() {
        for round in 0..2 {
            glommio::LocalExecutor::default().run(async move {
                let (listener, addr) = listener();
                let (go, wait) = std::sync::mpsc::channel::<()>();
                let talking = client(addr, move |mut socket| {
                    wait.recv().expect("waiting");
                    socket.write_all(b"late").expect("send");
                    wait.recv().expect("read");
                });
                let mut socket = PlainTcp::new(listener.accept().await.expect("accept"));
                let reader = glommio::spawn_local(async move {
                    let mut buf = [0u8; 8];
                    let n = socket.read(&mut buf).await.expect("read");
                    buf[..n].to_vec()
                });
                // The read waits on this executor's instance, which an event must wake.
                glommio::timer::sleep(Duration::from_millis(50)).await;
                go.send(()).expect("client");
                assert_eq!(bounded(reader).await, b"late", "round {round}");
                go.send(()).expect("client");
                talking.join().expect("client");
            });
        }
    }

    /// Reads everything `socket` receives until its peer leaves, each read straight into the
    /// spare capacity of a buffer whose spare bytes hold garbage (`0xAA`, as a reused body
    /// buffer's would), at most `most` bytes a read; `fail_watch_after` bytes in, the core's
    /// watch fails and the reads go on through glommio.
    async fn read_into_spare_until_closed(
        socket: &mut PlainTcp,
        most: usize,
        fail_watch_after: usize,
    ) -> Vec<u8> {
        use crate::transport::socket::Socket;
        let mut received = bytes::BytesMut::with_capacity(most);
        received.extend_from_slice(&vec![0xAA; most]);
        received.clear();
        loop {
            if received.len() >= fail_watch_after && !socket_reads_through_glommio() {
                fail_watch();
            }
            received.reserve(most);
            let before = received.len();
            let mut spare = tokio::io::ReadBuf::uninit(&mut received.spare_capacity_mut()[..most]);
            bounded(std::future::poll_fn(|cx| {
                socket.poll_read_buf(cx, &mut spare)
            }))
            .await
            .expect("read");
            let read = spare.filled().len();
            // SAFETY: the filled part of a `ReadBuf` is initialized; it starts at `before`.
            unsafe { received.set_len(before + read) };
            if read == 0 {
                return received.to_vec();
            }
            // Each later read lands on garbage again.
            let spare = received.spare_capacity_mut();
            let garbage = spare.len().min(most);
            for byte in &mut spare[..garbage] {
                byte.write(0xAA);
            }
        }
    }

    /// Whether this core's sockets read through glommio now (its watch failed).
    fn socket_reads_through_glommio() -> bool {
        this_core().is_none_or(|readiness| readiness.failed.get())
    }

    #[test]
    fn reads_into_uninitialized_room_keep_exactly_the_bytes_sent_through_epoll_and_glommio() {
        glommio::LocalExecutor::default().run(async {
            let (listener, addr) = listener();
            // No byte is 0xAA, so a byte of the buffer's garbage read as data changes the
            // bytes compared, and a count too high reads garbage.
            let sent: Vec<u8> = (0..300_000u32).map(|i| (i % 170) as u8).collect();
            let expected = sent.clone();
            let talking = client(addr, move |mut socket| {
                for piece in sent.chunks(7_777) {
                    socket.write_all(piece).expect("send");
                }
            });
            let mut socket = PlainTcp::new(listener.accept().await.expect("accept"));
            let received = read_into_spare_until_closed(&mut socket, 64 * 1024, 150_000).await;
            assert!(
                socket_reads_through_glommio(),
                "the second half read through glommio"
            );
            assert_eq!(received.len(), expected.len());
            assert!(received == expected, "bytes differ");
            talking.join().expect("client");
        });
    }

    #[test]
    fn a_failed_watch_hands_waiting_reads_to_glommio() {
        glommio::LocalExecutor::default().run(async {
            let (listener, addr) = listener();
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let talking = client(addr, move |mut socket| {
                wait.recv().expect("failed");
                socket.write_all(b"after").expect("send");
                wait.recv().expect("read");
            });
            let mut socket = PlainTcp::new(listener.accept().await.expect("accept"));
            let reader = glommio::spawn_local(async move {
                let mut buf = [0u8; 16];
                let n = socket.read(&mut buf).await.expect("read");
                (buf[..n].to_vec(), registered_sockets())
            });
            glommio::timer::sleep(Duration::from_millis(50)).await;
            assert_eq!(registered_sockets(), 1);
            fail_watch();
            go.send(()).expect("client");
            let (read, registered) = bounded(reader).await;
            assert_eq!(read, b"after");
            assert_eq!(registered, 0, "the socket left the instance");
            go.send(()).expect("client");
            talking.join().expect("client");
        });
    }
}
