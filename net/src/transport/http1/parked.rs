//! Parked subscribers: live (SSE) responses on plain HTTP/1.1 connections that wait at the
//! tail, held by their core without a task each.
//!
//! A subscriber waiting for new records in its connection's task holds the task's future, the
//! read it waits on, the writer's state and glommio's stream, about 4 KiB in all
//! (docs/decisions/2026-12-parked-subscribers.md). Parked, it is its socket's descriptor, its
//! response's state ([`LiveEvents`]) and a few words here:
//!
//! - subscribers of a stream with the same next read (`pico_engine::ReadShape`, the key the
//!   engine shares reads by) form a group, and one task per group reads for all of them
//!   (through the engine's shared read of that shape, `engine/src/live.rs`), waiting until
//!   the first of them is due a keep-alive or the end of its response;
//! - each member takes the driver's steps with the answer (`transport/drive.rs`): its events,
//!   written to its socket at once without waiting (`send` with `MSG_DONTWAIT`), then its
//!   next read; the group moves on to the next offset;
//! - one `epoll` instance per core watches the parked sockets for bytes or a hang-up, and one
//!   task waits on it (`glommio::net::poll_readable`, vendor/glommio/PATCHES.md, change 5).
//!
//! Anything else hands the connection back to a task ([`Resume`]): a socket that does not take
//! all of its events at once (the task writes the rest, waiting for room), a peer that sends
//! bytes or leaves, a response that ends (its last chunk, then the connection's next request).
//! The task parks it again once it waits at the tail with nothing to send.
//!
//! Only plain TCP parks: a TLS connection's records are written by rustls in its task.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pico_engine::{CoreHandle, ReadBatch, ReadShape};

use super::write::Chunks;
use super::{Parked, Streaming};
use crate::live_response::{live_read, LiveBody};
use crate::transport::drive::{stage_ready, tail_read};
use crate::transport::readiness::{epoll_instance, next_events};
use crate::transport::socket::PlainTcp;

/// Subscribers parked on all cores of this process (`pico_sse_parked` in the metrics).
pub static PARKED_SUBSCRIBERS: AtomicU64 = AtomicU64::new(0);

/// What serves a parked connection again: the listener's, spawning the connection's task (it
/// carries the connection's place in the core's count of open connections).
pub type Resume = Box<dyn FnOnce(Parked<PlainTcp>)>;

/// The most readiness events taken from the `epoll` instance per wake-up.
const EPOLL_EVENTS_PER_WAKE_MAX: usize = 64;

/// A member due within this much of a shared read's answer takes its keep-alive with it,
/// rather than a read of its own a moment later.
const DUE_SLACK: Duration = Duration::from_millis(1);

/// Members a group answers between looks at the core's preemption timer: a few hundred
/// microseconds of socket writes.
const DELIVER_CHUNK_MEMBERS: usize = 64;

thread_local! {
    /// This core's parked subscribers, made on the first park (`None` if the core cannot make
    /// an `epoll` instance: its connections then stay tasks).
    static PARKED: OnceCell<Option<Rc<Registry>>> = const { OnceCell::new() };
}

/// Parks a connection whose live response waits at the tail (its task has ended), or hands it
/// straight back to `resume` when it cannot wait here.
pub fn park(parked: Parked<PlainTcp>, resume: Resume) {
    let registry = PARKED.with(|cell| cell.get_or_init(Registry::start).clone());
    match registry {
        Some(registry) => registry.park(parked, resume),
        None => resume(parked),
    }
}

/// A parked subscriber.
struct Member {
    /// The connection's socket, non-blocking (glommio's sockets are).
    fd: OwnedFd,
    /// The response (unboxed from its `Streaming` while parked: one allocation less each).
    live: LiveBody,
    keep_alive: bool,
    resume: Resume,
    /// When its round ends: its next keep-alive, or the end of its response.
    due: Instant,
}

/// A member's place in the slots; the generation tells a later occupant of the same slot from
/// it (a group, or the `epoll` instance, may still name a member that left).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MemberId {
    index: u32,
    generation: u32,
}

impl MemberId {
    /// The member as an `epoll` event's data.
    fn token(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    fn from_token(token: u64) -> MemberId {
        MemberId {
            index: token as u32,
            generation: (token >> 32) as u32,
        }
    }
}

#[derive(Default)]
struct Slot {
    generation: u32,
    member: Option<Member>,
}

/// The members that wait at one offset of one stream, and the read that waits for them.
struct Group {
    name: Rc<str>,
    core: Rc<CoreHandle>,
    shape: Cell<ReadShape>,
    members: RefCell<Vec<MemberId>>,
    /// When the read in flight stops waiting, while one is.
    read_until: Cell<Option<Instant>>,
    /// Wakes the group's task to start its read again: a member due sooner joined.
    replan: Kick,
}

impl Group {
    /// Adds a member to this group; its read starts again if the member is due before it
    /// ends.
    fn join(&self, id: MemberId, due: Instant) {
        self.members.borrow_mut().push(id);
        if self.read_until.get().is_some_and(|until| due < until) {
            self.replan.kick();
        }
    }
}

/// One core's parked subscribers.
struct Registry {
    epoll: OwnedFd,
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<u32>>,
    groups: RefCell<HashMap<Rc<str>, Vec<Rc<Group>>>>,
}

impl Registry {
    /// This core's registry and its task watching the parked sockets.
    fn start() -> Option<Rc<Registry>> {
        let epoll = match epoll_instance() {
            Ok(epoll) => epoll,
            Err(e) => {
                log::warn!("parked subscribers off on this core (epoll_create1: {e})");
                return None;
            }
        };
        let registry = Rc::new(Registry {
            epoll,
            slots: RefCell::default(),
            free: RefCell::default(),
            groups: RefCell::default(),
        });
        glommio::spawn_local(watch_peers(registry.clone())).detach();
        Some(registry)
    }

    fn park(self: &Rc<Self>, mut parked: Parked<PlainTcp>, resume: Resume) {
        let live = &mut parked.streaming.live;
        let Some((shape, wait_ms)) = tail_read(live) else {
            return resume(parked);
        };
        let (name, core) = (live.stream_name().to_owned(), live.core().clone());
        let due = Instant::now() + Duration::from_millis(wait_ms);
        // A connection whose descriptor cannot be taken (out of descriptors) is lost: it
        // closes, and its client reconnects.
        let Ok(fd) = parked.socket.into_fd() else {
            return;
        };
        let Streaming {
            live, keep_alive, ..
        } = *parked.streaming;
        let member = Member {
            fd,
            live,
            keep_alive,
            resume,
            due,
        };
        let id = self.insert(member);
        if let Err(e) = self.watch(id) {
            log::warn!("cannot park a subscriber: {e}");
            self.hand_back(id, Bytes::new(), false);
            return;
        }
        self.place(id, &name, &core, shape, due);
    }

    fn insert(&self, member: Member) -> MemberId {
        let mut slots = self.slots.borrow_mut();
        let index = match self.free.borrow_mut().pop() {
            Some(index) => index,
            None => {
                slots.push(Slot::default());
                u32::try_from(slots.len() - 1).expect("fewer parked subscribers than 2^32")
            }
        };
        let slot = &mut slots[index as usize];
        slot.member = Some(member);
        PARKED_SUBSCRIBERS.fetch_add(1, Ordering::Relaxed);
        MemberId {
            index,
            generation: slot.generation,
        }
    }

    /// Takes a member out of its slot (`None` if it left already).
    fn remove(&self, id: MemberId) -> Option<Member> {
        let mut slots = self.slots.borrow_mut();
        let slot = slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        let member = slot.member.take()?;
        PARKED_SUBSCRIBERS.fetch_sub(1, Ordering::Relaxed);
        slot.generation = slot.generation.wrapping_add(1);
        self.free.borrow_mut().push(id.index);
        Some(member)
    }

    /// Watches the member's socket for bytes or a hang-up.
    fn watch(&self, id: MemberId) -> io::Result<()> {
        let slots = self.slots.borrow();
        let fd = slots[id.index as usize]
            .member
            .as_ref()
            .map(|m| m.fd.as_raw_fd())
            .ok_or(io::ErrorKind::NotFound)?;
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: id.token(),
        };
        // SAFETY: both descriptors are open; `event` is read during the call only.
        let added =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if added < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn unwatch(&self, fd: &OwnedFd) {
        // SAFETY: both descriptors are open; a null event is allowed for a removal.
        unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                std::ptr::null_mut(),
            );
        }
    }

    /// Adds a member to the group that reads `shape` of the stream `name`, making the group
    /// (and its task) if there is none; returns the group.
    fn place(
        self: &Rc<Self>,
        id: MemberId,
        name: &str,
        core: &Rc<CoreHandle>,
        shape: ReadShape,
        due: Instant,
    ) -> Rc<Group> {
        let mut groups = self.groups.borrow_mut();
        let existing = groups
            .get(name)
            .and_then(|list| list.iter().find(|g| g.shape.get() == shape))
            .cloned();
        let (group, new) = match existing {
            Some(group) => (group, false),
            None => {
                let name: Rc<str> = Rc::from(name);
                let group = Rc::new(Group {
                    name: name.clone(),
                    core: core.clone(),
                    shape: Cell::new(shape),
                    members: RefCell::default(),
                    read_until: Cell::new(None),
                    replan: Kick::default(),
                });
                groups.entry(name).or_default().push(group.clone());
                (group, true)
            }
        };
        // No borrow is held past here: a task spawned may run before `spawn_local` returns.
        drop(groups);
        if !new {
            group.join(id, due);
            return group;
        }
        group.members.borrow_mut().push(id);
        let task = crate::panics::catch_panic(run_group(self.clone(), group.clone()));
        glommio::spawn_local(async move {
            if task.await.is_err() {
                log::error!("a group of parked subscribers failed");
            }
        })
        .detach();
        group
    }

    /// The group's next due time (`None`: it has no members left); members that left are
    /// dropped from its list.
    fn earliest_due(&self, group: &Group) -> Option<Instant> {
        let slots = self.slots.borrow();
        let mut members = group.members.borrow_mut();
        let mut earliest = None::<Instant>;
        members.retain(|id| {
            let slot = &slots[id.index as usize];
            match &slot.member {
                Some(member) if slot.generation == id.generation => {
                    earliest = Some(earliest.map_or(member.due, |e| e.min(member.due)));
                    true
                }
                _ => false,
            }
        });
        earliest
    }

    /// Drops a group with no members from the map (its task ends).
    fn forget(&self, group: &Rc<Group>) {
        let mut groups = self.groups.borrow_mut();
        if let Some(list) = groups.get_mut(&*group.name) {
            list.retain(|g| !Rc::ptr_eq(g, group));
            if list.is_empty() {
                groups.remove(&*group.name);
            }
        }
    }

    /// Answers a group's members with its read: every member if there is news (records, the
    /// stream closed or gone, the node stopping), else those whose round is over (a
    /// keep-alive, or the end). Each is written to at once; a member stays parked if its
    /// socket took everything and it waits at the tail again. Between every
    /// `DELIVER_CHUNK_MEMBERS` members the task yields if the core's preemption timer has
    /// fired: thousands of members take tens of milliseconds of writes, and the core's other
    /// tasks (a writer's acknowledgement, another core's message) would wait for all of them.
    async fn deliver(self: &Rc<Self>, group: &Rc<Group>, read: Option<(ReadBatch, bool)>) {
        let now = Instant::now();
        let news = match &read {
            None => true,
            Some((batch, last)) => {
                !batch.records.is_empty() || batch.closed || batch.inherit.is_some() || *last
            }
        };
        let ids = std::mem::take(&mut *group.members.borrow_mut());
        let mut waiting = Vec::new();
        let mut staying = Vec::new();
        let mut out = Chunks::default();
        for chunk in ids.chunks(DELIVER_CHUNK_MEMBERS) {
            // A member may have left while the task yielded: its slot's generation moved on.
            glommio::yield_if_needed().await;
            let mut handed_back = Vec::new();
            let mut closed = Vec::new();
            let mut slots = self.slots.borrow_mut();
            for &id in chunk {
                let slot = &mut slots[id.index as usize];
                if slot.generation != id.generation {
                    continue;
                }
                let Some(member) = slot.member.as_mut() else {
                    continue;
                };
                if !news && member.due > now + DUE_SLACK {
                    waiting.push(id);
                    continue;
                }
                // The steps of `drive` (`transport/drive.rs`), the read made by the group and
                // the write made without waiting.
                let live = &mut member.live;
                live.answer(read.as_ref());
                out.0.clear();
                stage_ready(live, &mut out, usize::MAX);
                match send_now(&member.fd, &out.0) {
                    Err(_) => closed.push(id),
                    Ok(sent) if sent < out.0.len() => {
                        handed_back.push((id, Bytes::copy_from_slice(&out.0[sent..])));
                    }
                    Ok(_) => match tail_read(live) {
                        Some((shape, wait_ms)) => {
                            member.due = now + Duration::from_millis(wait_ms);
                            staying.push((id, shape, member.due));
                        }
                        None => handed_back.push((id, Bytes::new())),
                    },
                }
            }
            drop(slots);
            // Before the task can yield again: a member whose socket did not take all of its
            // answer gets its connection back with the rest now, or the watch could hand it
            // back without it (its peer sent bytes) and the rest would be lost.
            for id in closed {
                if let Some(member) = self.remove(id) {
                    self.unwatch(&member.fd);
                }
            }
            for (id, unsent) in handed_back {
                self.hand_back(id, unsent, false);
            }
        }
        group.members.borrow_mut().extend(waiting);
        if news {
            // The group moves on with its members (they all read the same answer), unless
            // another group reads there already: its members then join that one.
            if let Some(&(_, shape, _)) = staying.first() {
                let taken = self
                    .groups
                    .borrow()
                    .get(&*group.name)
                    .is_some_and(|list| list.iter().any(|g| g.shape.get() == shape));
                if !taken {
                    group.shape.set(shape);
                }
            }
        }
        // They read alike as a rule: the group they join is looked up once, not per member.
        let mut joined: Option<Rc<Group>> = None;
        for (id, shape, due) in staying {
            match &joined {
                Some(target) if target.shape.get() == shape => target.join(id, due),
                _ => joined = Some(self.place(id, &group.name, &group.core, shape, due)),
            }
        }
    }

    /// Gives a member's connection back to a task, `unsent` to be written first; `stirred`
    /// when its peer sent bytes or hung up.
    fn hand_back(&self, id: MemberId, unsent: Bytes, stirred: bool) {
        let Some(member) = self.remove(id) else {
            return;
        };
        self.unwatch(&member.fd);
        let Member {
            fd,
            live,
            keep_alive,
            resume,
            ..
        } = member;
        resume(Parked {
            socket: PlainTcp::from_fd(fd),
            streaming: Box::new(Streaming {
                live,
                unsent,
                keep_alive,
                stirred,
            }),
        });
    }
}

/// A group's task: reads for its members until none is left.
async fn run_group(registry: Rc<Registry>, group: Rc<Group>) {
    loop {
        let Some(due) = registry.earliest_due(&group) else {
            registry.forget(&group);
            return;
        };
        let wait = due.saturating_duration_since(Instant::now());
        let wait_ms = u64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        let request = group.shape.get().request(wait_ms);
        group.read_until.set(Some(due));
        let read = futures_lite::future::or(
            async { Some(live_read(&group.core, &group.name, &request).await) },
            async {
                group.replan.wait().await;
                None
            },
        )
        .await;
        group.read_until.set(None);
        if let Some(read) = read {
            registry.deliver(&group, read).await;
        }
    }
}

/// The core's task watching its parked sockets: a peer that sends bytes or hangs up gets its
/// connection back in a task, which reads them.
async fn watch_peers(registry: Rc<Registry>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EPOLL_EVENTS_PER_WAKE_MAX];
    loop {
        let ready = match next_events(&registry.epoll, &mut events).await {
            Ok(ready) => ready,
            Err(e) => {
                log::error!("parked subscribers' watch failed: {e}");
                return;
            }
        };
        for event in ready {
            let id = MemberId::from_token(event.u64);
            registry.hand_back(id, Bytes::new(), true);
        }
    }
}

/// Writes what the socket takes of `bytes` now: the count sent (0 when it is full).
fn send_now(fd: &OwnedFd, bytes: &[u8]) -> io::Result<usize> {
    if bytes.is_empty() {
        return Ok(0);
    }
    loop {
        // SAFETY: `bytes` is valid for its length during the call.
        let sent = unsafe {
            libc::send(
                fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(error),
        }
    }
}

/// Wakes a waiting task once (set while none waits, it is kept for the next wait).
#[derive(Default)]
struct Kick {
    kicked: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Kick {
    fn kick(&self) {
        self.kicked.set(true);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.kicked.replace(false) {
                return Poll::Ready(());
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a parked subscriber holds here, besides its response's state (`live_response.rs` tests
    /// that): its slot, where a waiting connection task holds about 4 KiB
    /// (docs/decisions/2026-12-parked-subscribers.md).
    #[test]
    fn a_parked_subscriber_holds_a_few_words() {
        let slot = std::mem::size_of::<Slot>();
        assert!(slot <= 72, "a parked subscriber's slot takes {slot} bytes");
    }

    #[test]
    fn a_member_s_token_names_its_slot_and_generation() {
        for id in [
            MemberId {
                index: 0,
                generation: 0,
            },
            MemberId {
                index: u32::MAX,
                generation: 7,
            },
            MemberId {
                index: 12,
                generation: u32::MAX,
            },
        ] {
            assert_eq!(MemberId::from_token(id.token()), id);
        }
    }
}
