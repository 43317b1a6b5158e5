//! A fault proxy in front of Postgres, for tests: it forwards each client connection to the
//! real server and, when a test says so, loses the answer to a COMMIT (the server committed,
//! the client sees its connection cut: the outcome is unknown to it), holds the server's
//! answers, delays the client's statements, cuts every open connection, or refuses new ones.
//!
//! ```text
//!   test ── PgProxy::inject(Fault) ──▶ Shared: armed losses, hold deadlines, open links
//!                                          │ read by
//!   client ──TCP──▶ 127.0.0.1:<port> ──────┼─ statements thread: client ──▶ server ──▶ Postgres
//!   (one link per connection)              └─ answers thread:    client ◀── server ◀──
//! ```
//!
//! Plain threads and blocking sockets, no async runtime: an acceptor thread, and two threads
//! per connection. Cutting a connection shuts both of its sockets down, which wakes both
//! threads' blocked reads and writes; dropping the [`PgProxy`] stops the acceptor, cuts every
//! connection and joins every thread.
//!
//! # What it reads of the wire protocol (version 3)
//!
//! Only as much as the faults need: where messages begin and end, which statements commit, and
//! which answer belongs to which statement. Every integer is big-endian.
//!
//! ```text
//!  the client's first packet (no type byte):
//!  ┌──────────────┬──────────────┬───────────────────────────────┐
//!  │ length: u32  │ code: u32    │ startup parameters (or none)  │   length counts itself
//!  └──────────────┴──────────────┴───────────────────────────────┘
//!    code 196608 (3.0): the startup packet, forwarded; the typed messages below follow
//!    code 80877103 (SSLRequest), 80877104 (GSSENCRequest), length 8: answered `N` (no) by
//!      the proxy itself, the client then sends its startup packet in the clear
//!    code 80877102 (CancelRequest): forwarded; the server closes the connection after it
//!
//!  every message after it, both directions:
//!  ┌──────────┬──────────────┬──────────────────────────────┐
//!  │ type: u8 │ length: u32  │ body: length - 4 bytes       │   length counts itself, not
//!  └──────────┴──────────────┴──────────────────────────────┘   the type byte
//!
//!  client → server, the ones read (strings end with a 0 byte):
//!    'Q' Query      sql               a statement (or several, `;`-separated); answered by a
//!                                     ReadyForQuery once done
//!    'P' Parse      name, sql, ...    prepares a statement ("" is the unnamed one)
//!    'B' Bind       portal, name, ... binds a prepared statement to a portal
//!    'E' Execute    portal, max rows  runs a portal's statement
//!    'C' Close      'S'|'P', name     forgets a statement or a portal
//!    'S' Sync       -                 ends an extended-protocol exchange; answered by a
//!                                     ReadyForQuery
//!    'F' FunctionCall ...             answered by a ReadyForQuery
//!  server → client, the ones read:
//!    'C' CommandComplete  tag         "COMMIT" once a COMMIT is done ("ROLLBACK" when the
//!                                     transaction had failed)
//!    'E' ErrorResponse    fields
//!    'Z' ReadyForQuery    status u8   one per Query, Sync and FunctionCall, in order, and one
//!                                     at the end of the startup
//! ```
//!
//! The answers to one Query, or to one Sync's exchange, end with the ReadyForQuery that
//! answers it, and the server answers in order. So the proxy numbers what is answered by a
//! ReadyForQuery ("turns": the startup is turn 0, then each Query, Sync and FunctionCall the
//! client sends), counts the ReadyForQuery messages coming back, and knows which turn every
//! server message belongs to, pipelined or not.
//!
//! A turn commits when its Query's last statement, or a statement its exchange Executes, starts
//! with `COMMIT` or `END` ([`ends_with_commit`]). The `postgres` crate (the metadata store's
//! client) sends its `COMMIT` as a Query: `batch_execute("COMMIT")` and `Transaction::commit`
//! alike; `execute("COMMIT", &[])` sends Parse, Bind, Execute and Sync. For
//! [`Fault::LoseCommitAnswerAfter`] the proxy also remembers what each transaction ran: the
//! text of every Query, and of every prepared statement a portal Executes (the metadata store
//! prepares its data statements once per connection and runs them through Bind and Execute).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections open at once, at most; more are refused (closed at once). A node opens one to
/// its metadata database, a test a few.
const CONNECTIONS_MAX: usize = 64;
/// The largest message forwarded. A whole message is read before any of it is forwarded (the
/// faults act between messages), so this bounds the memory of one connection; a bigger message
/// cuts the connection. Metadata statements and rows are far smaller.
const MESSAGE_BYTES_MAX: usize = 64 << 20;
/// Postgres' own limit on the startup packet (`MAX_STARTUP_PACKET_LENGTH`).
const STARTUP_BYTES_MAX: usize = 10_000;
/// Encryption requests (SSL, GSS) refused before the startup packet, at most (a client sends
/// each at most once).
const NEGOTIATIONS_MAX: usize = 2;
/// Prepared statement and portal names remembered per connection; past it they are forgotten
/// (a COMMIT run through a forgotten one is then not recognised). Statements a client prepares
/// once and reuses stay far below it.
const NAMES_MAX: usize = 4096;
/// Distinct statement texts remembered per transaction, for
/// [`Fault::LoseCommitAnswerAfter`]; past it a transaction's later statements are not matched.
/// A metadata batch runs a few distinct statements however many commands it holds.
const RAN_MAX: usize = 256;
/// Tags of lost answers kept for [`PgProxy::lost_answers`].
const LOST_TAGS_MAX: usize = 64;
/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a waiting thread looks again at the stop flag, its connection and the deadlines.
const POLL: Duration = Duration::from_millis(5);
/// Bytes read from a socket at once.
const READ_BYTES: usize = 16 << 10;

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// A fault, injected with [`PgProxy::inject`]; it acts on the next matching event or for a
/// period from now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next COMMIT (on any connection) reaches the server, which commits it; its answer is
    /// read and thrown away, and that connection is cut: the client sees its connection close
    /// with the outcome unknown. Each injection arms one more.
    LoseCommitAnswer,
    /// [`Fault::LoseCommitAnswer`] for the next COMMIT of a transaction that ran a statement
    /// whose text contains this (`"DELETE FROM streams"`), whenever that comes.
    LoseCommitAnswerAfter(&'static str),
    /// Nothing the server sends reaches the clients for this long from now: answers that
    /// arrive meanwhile are delivered, in order, when it ends.
    HoldAnswers(Duration),
    /// Nothing the clients send reaches the server for this long from now: statements sent
    /// meanwhile reach it, in order, when it ends.
    DelayStatements(Duration),
    /// Every open connection is cut now, both ways (new ones are accepted).
    CutAll,
    /// While `true`, new connections are closed as soon as they are accepted.
    Refuse(bool),
}

/// What the proxy did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted and forwarded.
    pub accepted: u64,
    /// Connections closed at once ([`Fault::Refuse`], or 64 already open).
    pub refused: u64,
    /// Turns clients sent: Queries, Syncs and FunctionCalls.
    pub turns: u64,
    /// Of them, those that commit.
    pub commits: u64,
    /// COMMIT answers lost ([`Fault::LoseCommitAnswer`] done: answer read, connection cut).
    pub commit_answers_lost: u64,
    /// Connections cut by [`Fault::CutAll`].
    pub cut: u64,
}

/// The proxy; it stops (and cuts every connection) when dropped. `Sync`: share it by
/// reference or in an `Arc` to inject faults from another thread.
pub struct PgProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl PgProxy {
    /// A proxy on `127.0.0.1:<a free port>` forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> io::Result<PgProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            stop: AtomicBool::new(false),
            refuse: AtomicBool::new(false),
            armed_losses: AtomicU64::new(0),
            armed_after: Mutex::new(Vec::new()),
            answers_held_until: Mutex::new(None),
            statements_delayed_until: Mutex::new(None),
            links: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            next_link: AtomicU64::new(0),
            lost_tags: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            turns: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            commit_answers_lost: AtomicU64::new(0),
            cut: AtomicU64::new(0),
        });
        let accepting = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("pg-proxy-accept".into())
            .spawn(move || accept_loop(&listener, &accepting))?;
        Ok(PgProxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// Where the proxy listens.
    pub fn address(&self) -> SocketAddr {
        self.addr
    }

    /// A proxy in front of the server a `postgres://` URL names, and that URL pointed at the
    /// proxy (user, password, database and parameters kept).
    pub fn in_front_of(url: &str) -> io::Result<(PgProxy, String)> {
        let (host_port, rebuild) = split_server(url)?;
        let upstream = host_port.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{host_port}: no address"))
        })?;
        let proxy = PgProxy::start(upstream)?;
        let proxied = rebuild(&proxy.addr.to_string());
        Ok((proxy, proxied))
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn inject(&self, fault: Fault) {
        let shared = &self.shared;
        match fault {
            Fault::LoseCommitAnswer => {
                shared.armed_losses.fetch_add(1, Ordering::SeqCst);
            }
            Fault::LoseCommitAnswerAfter(statement) => lock(&shared.armed_after).push(statement),
            Fault::HoldAnswers(period) => extend(&shared.answers_held_until, period),
            Fault::DelayStatements(period) => extend(&shared.statements_delayed_until, period),
            Fault::CutAll => shared.cut_all(),
            Fault::Refuse(refuse) => shared.refuse.store(refuse, Ordering::SeqCst),
        }
    }

    /// Ends every fault still in force: armed losses, holds and delays, refusing.
    pub fn heal(&self) {
        let shared = &self.shared;
        shared.armed_losses.store(0, Ordering::SeqCst);
        lock(&shared.armed_after).clear();
        *lock(&shared.answers_held_until) = None;
        *lock(&shared.statements_delayed_until) = None;
        shared.refuse.store(false, Ordering::SeqCst);
    }

    /// [`Fault::LoseCommitAnswer`]s and [`Fault::LoseCommitAnswerAfter`]s injected and not
    /// used yet.
    pub fn armed_losses(&self) -> u64 {
        let after = lock(&self.shared.armed_after).len() as u64;
        self.shared.armed_losses.load(Ordering::SeqCst) + after
    }

    pub fn stats(&self) -> Stats {
        let shared = &self.shared;
        let get = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
        Stats {
            accepted: get(&shared.accepted),
            refused: get(&shared.refused),
            turns: get(&shared.turns),
            commits: get(&shared.commits),
            commit_answers_lost: get(&shared.commit_answers_lost),
            cut: get(&shared.cut),
        }
    }

    /// What the server answered to each COMMIT whose answer was lost, in order (the first
    /// 64): its CommandComplete tag, `"COMMIT"` when it committed, or
    /// `"ERROR"`.
    pub fn lost_answers(&self) -> Vec<String> {
        lock(&self.shared.lost_tags).clone()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.links).len()
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // No new link starts now; a link still connecting sees `stop` when it registers.
        self.shared.cut_all();
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// What the test's handle and the proxy's threads share.
struct Shared {
    upstream: SocketAddr,
    stop: AtomicBool,
    refuse: AtomicBool,
    /// [`Fault::LoseCommitAnswer`]s not used yet.
    armed_losses: AtomicU64,
    /// [`Fault::LoseCommitAnswerAfter`]s not used yet, in the order injected.
    armed_after: Mutex<Vec<&'static str>>,
    answers_held_until: Mutex<Option<Instant>>,
    statements_delayed_until: Mutex<Option<Instant>>,
    /// Open connections by id.
    links: Mutex<HashMap<u64, Arc<Link>>>,
    /// One per connection (its statements thread), joined on drop; finished ones are dropped
    /// as new connections come.
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_link: AtomicU64,
    lost_tags: Mutex<Vec<String>>,
    accepted: AtomicU64,
    refused: AtomicU64,
    turns: AtomicU64,
    commits: AtomicU64,
    commit_answers_lost: AtomicU64,
    cut: AtomicU64,
}

/// Locks, ignoring poisoning: every value behind these locks stays valid whatever panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Moves a hold's end to `period` from now, unless it already ends later.
fn extend(until: &Mutex<Option<Instant>>, period: Duration) {
    let end = Instant::now() + period;
    let mut until = lock(until);
    *until = Some(until.map_or(end, |current| current.max(end)));
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn cut_all(&self) {
        let links: Vec<Arc<Link>> = lock(&self.links).values().cloned().collect();
        for link in links {
            if link.close() {
                self.cut.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Starts forwarding a new connection, or closes it (refusing, full, stopping).
    fn admit(self: &Arc<Self>, client: TcpStream) {
        let mut threads = lock(&self.threads);
        threads.retain(|thread| !thread.is_finished());
        let full = threads.len() >= CONNECTIONS_MAX;
        if full || self.refuse.load(Ordering::SeqCst) || self.stopped() {
            self.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("pg-proxy-link".into())
            .spawn(move || run_link(&shared, client));
        match spawned {
            Ok(thread) => {
                self.accepted.fetch_add(1, Ordering::SeqCst);
                threads.push(thread);
            }
            // The client (moved into the closure) is closed with it.
            Err(_) => {
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Waits while `until` (a hold or a delay) is in the future, the proxy runs and `link` is
    /// open. Ends at the latest deadline injected meanwhile.
    fn wait_out(&self, until: &Mutex<Option<Instant>>, link: &Link) {
        loop {
            let Some(deadline) = *lock(until) else {
                return;
            };
            let now = Instant::now();
            if now >= deadline || self.stopped() || link.is_closed() {
                return;
            }
            std::thread::sleep((deadline - now).min(POLL));
        }
    }

    /// A loss armed for a COMMIT of a transaction that ran `ran`, used up; `false` when none
    /// is armed for it.
    fn take_loss(&self, ran: &Ran) -> bool {
        let any = self
            .armed_losses
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if any.is_ok() {
            return true;
        }
        let mut after = lock(&self.armed_after);
        let matching = after.iter().position(|statement| ran.contains(statement));
        matching.map(|at| after.remove(at)).is_some()
    }

    fn record_lost(&self, tag: String) {
        let mut tags = lock(&self.lost_tags);
        if tags.len() < LOST_TAGS_MAX {
            tags.push(tag);
        }
    }
}

/// Accepts until the proxy stops: a loop that sleeps [`POLL`] whenever nothing is waiting.
fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stopped() {
        match listener.accept() {
            Ok((client, _)) => {
                // Forwarding blocks on reads; whether an accepted socket inherits the
                // listener's non-blocking mode differs between platforms.
                if client.set_nonblocking(false).is_ok() {
                    shared.admit(client);
                }
            }
            // Nothing waiting, or out of descriptors for a moment: look again soon.
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// One proxied connection: the two sockets (kept to cut them) and where its turns stand.
struct Link {
    client: TcpStream,
    server: TcpStream,
    closed: AtomicBool,
    turns: Mutex<Turns>,
}

/// Which answer belongs to which statement (see the module's doc).
#[derive(Default)]
struct Turns {
    /// Turns the client sent after its startup packet (turn 0).
    sent: u64,
    /// ReadyForQuery messages the server sent: the server's messages belong to this turn.
    answered: u64,
    /// The turn whose answer is lost: a COMMIT taken by [`Fault::LoseCommitAnswer`].
    lose: Option<u64>,
}

impl Link {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Cuts both sockets (waking both threads); whether this call did it.
    fn close(&self) -> bool {
        if self.closed.swap(true, Ordering::SeqCst) {
            return false;
        }
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
        true
    }

    /// The client sent one more turn, after the statements of its transaction so far `ran`;
    /// whether its answer is to be lost (then nothing after it is forwarded).
    fn sent_turn(&self, shared: &Shared, commits: bool, ran: &Ran) -> bool {
        let mut turns = lock(&self.turns);
        turns.sent += 1;
        shared.turns.fetch_add(1, Ordering::SeqCst);
        if !commits {
            return false;
        }
        shared.commits.fetch_add(1, Ordering::SeqCst);
        if turns.lose.is_none() && shared.take_loss(ran) {
            turns.lose = Some(turns.sent);
            return true;
        }
        false
    }
}

/// Connects to the server and forwards one connection both ways until either side ends it or
/// it is cut.
fn run_link(shared: &Arc<Shared>, client: TcpStream) {
    let Ok(server) = TcpStream::connect_timeout(&shared.upstream, CONNECT_TIMEOUT) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let clones = client
        .try_clone()
        .and_then(|c| Ok((c, server.try_clone()?)));
    let Ok((client_reader, server_reader)) = clones else {
        return;
    };
    let link = Arc::new(Link {
        client,
        server,
        closed: AtomicBool::new(false),
        turns: Mutex::new(Turns::default()),
    });
    let id = shared.next_link.fetch_add(1, Ordering::SeqCst);
    {
        let mut links = lock(&shared.links);
        if shared.stopped() {
            link.close();
            return;
        }
        links.insert(id, Arc::clone(&link));
    }
    let answers = {
        let (shared, link) = (Arc::clone(shared), Arc::clone(&link));
        let client_writer = link.client.try_clone();
        std::thread::Builder::new()
            .name("pg-proxy-answers".into())
            .spawn(move || {
                if let Ok(client_writer) = client_writer {
                    let _ = forward_answers(&shared, &link, server_reader, client_writer);
                }
                link.close();
            })
    };
    if answers.is_ok() {
        let lost = forward_statements(shared, &link, client_reader);
        // A lost COMMIT leaves the cut to the answers thread, once the server answered it.
        if !matches!(lost, Ok(Ended::Losing)) {
            link.close();
        }
    }
    if let Ok(answers) = answers {
        let _ = answers.join();
    }
    link.close();
    lock(&shared.links).remove(&id);
}

/// How forwarding statements ended without an error.
enum Ended {
    /// A COMMIT whose answer is to be lost went through; nothing more is forwarded.
    Losing,
}

/// Forwards the client's startup packet, then its messages, to the server. Each round reads
/// at least one byte or ends, and the connection ends it.
fn forward_statements(shared: &Shared, link: &Link, mut client: TcpStream) -> io::Result<Ended> {
    let mut server = link.server.try_clone()?;
    let startup = read_startup(&mut client)?;
    shared.wait_out(&shared.statements_delayed_until, link);
    server.write_all(&startup)?;
    let mut frames = Frames::default();
    let mut names = Names::default();
    // What the transaction ran so far, and whether the turn being sent commits it (a Query
    // that commits, or a commit Executed since the last Sync).
    let mut ran = Ran::default();
    let mut commits = false;
    loop {
        let whole = frames.fill(&mut client)?;
        let mut forward = whole;
        let mut losing = false;
        let mut at = 0;
        while at < whole {
            let message = next_message(&frames.buffer[at..whole])?.expect("whole messages");
            at += message.len;
            let turn = match message.kind {
                b'Q' => {
                    let sql: Arc<str> = text(message.body).into();
                    commits = ends_with_commit(&sql);
                    ran.add(sql);
                    true
                }
                b'P' => {
                    names.parse(message.body);
                    false
                }
                b'B' => {
                    names.bind(message.body);
                    false
                }
                b'E' => {
                    if let Some(sql) = names.executed(message.body) {
                        commits |= ends_with_commit(&sql);
                        ran.add(sql);
                    }
                    false
                }
                b'C' => {
                    names.close(message.body);
                    false
                }
                b'S' | b'F' => true,
                _ => false,
            };
            if turn {
                if link.sent_turn(shared, commits, &ran) {
                    forward = at;
                    losing = true;
                    break;
                }
                if commits || ran.rolled_back {
                    ran = Ran::default();
                }
                commits = false;
            }
        }
        shared.wait_out(&shared.statements_delayed_until, link);
        server.write_all(&frames.buffer[..forward])?;
        if losing {
            return Ok(Ended::Losing);
        }
        frames.consume(whole);
    }
}

/// Reads the client's startup packet, answering encryption requests with `N` (the client
/// then goes on in the clear); the packet's bytes.
fn read_startup(client: &mut TcpStream) -> io::Result<Vec<u8>> {
    for _ in 0..=NEGOTIATIONS_MAX {
        let mut head = [0u8; 8];
        client.read_exact(&mut head)?;
        let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if !(8..=STARTUP_BYTES_MAX).contains(&length) {
            return Err(invalid(format!("a startup packet of {length} bytes")));
        }
        if length == 8 && (code == SSL_REQUEST || code == GSSENC_REQUEST) {
            client.write_all(b"N")?;
            continue;
        }
        let mut packet = head.to_vec();
        packet.resize(length, 0);
        client.read_exact(&mut packet[8..])?;
        return Ok(packet);
    }
    Err(invalid(format!(
        "more than {NEGOTIATIONS_MAX} encryption requests before the startup packet"
    )))
}

/// Forwards the server's messages to the client, holding them while [`Fault::HoldAnswers`]
/// lasts, and throws away the answer of a turn to be lost, then ends (the caller cuts the
/// connection). Each round reads at least one byte or ends.
fn forward_answers(
    shared: &Shared,
    link: &Link,
    mut server: TcpStream,
    mut client: TcpStream,
) -> io::Result<()> {
    let mut frames = Frames::default();
    let mut forward = Vec::new();
    loop {
        let whole = frames.fill(&mut server)?;
        forward.clear();
        let mut lost = false;
        {
            let mut turns = lock(&link.turns);
            let mut at = 0;
            while at < whole {
                let bytes = &frames.buffer[at..whole];
                let message = next_message(bytes)?.expect("whole messages");
                at += message.len;
                let losing = turns.lose == Some(turns.answered);
                if message.kind == b'Z' {
                    turns.answered += 1;
                }
                if !losing {
                    forward.extend_from_slice(&bytes[..message.len]);
                    continue;
                }
                match message.kind {
                    b'C' => shared.record_lost(text(message.body)),
                    b'E' => shared.record_lost("ERROR".into()),
                    b'Z' => {
                        lost = true;
                        break;
                    }
                    _ => {}
                }
            }
        }
        shared.wait_out(&shared.answers_held_until, link);
        client.write_all(&forward)?;
        if lost {
            shared.commit_answers_lost.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        frames.consume(whole);
    }
}

/// Bytes read from one side, not forwarded yet.
#[derive(Default)]
struct Frames {
    buffer: Vec<u8>,
}

impl Frames {
    /// Reads until the buffer starts with at least one whole message; the length of its whole
    /// messages. An end of the stream is an error (`UnexpectedEof`), like a message longer
    /// than [`MESSAGE_BYTES_MAX`]. Bounded: every read adds bytes, and a message's length is.
    fn fill(&mut self, from: &mut TcpStream) -> io::Result<usize> {
        let mut chunk = [0u8; READ_BYTES];
        loop {
            let whole = whole_messages(&self.buffer)?;
            if whole > 0 {
                return Ok(whole);
            }
            let read = from.read(&mut chunk)?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }

    fn consume(&mut self, bytes: usize) {
        self.buffer.drain(..bytes);
    }
}

/// One typed message at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
struct Message<'a> {
    kind: u8,
    body: &'a [u8],
    /// Its bytes in all, type and length included.
    len: usize,
}

/// The message `bytes` starts with; `None` while it is incomplete.
fn next_message(bytes: &[u8]) -> io::Result<Option<Message<'_>>> {
    let Some(head) = bytes.get(..5) else {
        return Ok(None);
    };
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if length < 4 {
        return Err(invalid(format!("a message length of {length}")));
    }
    if length > MESSAGE_BYTES_MAX {
        return Err(invalid(format!(
            "a message of {length} bytes (the proxy forwards at most {MESSAGE_BYTES_MAX})"
        )));
    }
    let len = 1 + length;
    Ok(bytes.get(5..len).map(|body| Message {
        kind: head[0],
        body,
        len,
    }))
}

/// How many bytes at the start of `bytes` are whole messages.
fn whole_messages(bytes: &[u8]) -> io::Result<usize> {
    let mut at = 0;
    while let Some(message) = next_message(&bytes[at..])? {
        at += message.len;
    }
    Ok(at)
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// The 0-terminated strings at the start of a message body (the last one may lack its 0).
fn strings(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    body.split(|byte| *byte == 0)
}

fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Whether a Query's text ends its transaction with a commit: its last statement starts with
/// `COMMIT` or `END` (any case). The text is split at every `;`, quotes and comments not
/// considered: enough for transaction control, which clients send as a statement of its own.
pub fn ends_with_commit(sql: &str) -> bool {
    let last = sql.split(';').map(str::trim).rfind(|s| !s.is_empty());
    let first_word = last.and_then(|statement| statement.split_whitespace().next());
    first_word
        .is_some_and(|word| word.eq_ignore_ascii_case("COMMIT") || word.eq_ignore_ascii_case("END"))
}

/// Whether a Query's text ends its transaction without a commit: its last statement is a
/// `ROLLBACK` or `ABORT` (not a `ROLLBACK TO` a savepoint, which keeps the transaction going).
fn ends_with_rollback(sql: &str) -> bool {
    let last = sql.split(';').map(str::trim).rfind(|s| !s.is_empty());
    let mut words = last.map(str::split_whitespace).into_iter().flatten();
    let first = words.next().unwrap_or_default();
    let second = words.next().unwrap_or_default();
    (first.eq_ignore_ascii_case("ROLLBACK") && !second.eq_ignore_ascii_case("TO"))
        || first.eq_ignore_ascii_case("ABORT")
}

/// The distinct statements a connection's current transaction ran (at most [`RAN_MAX`]), for
/// [`Fault::LoseCommitAnswerAfter`]; reset after a turn that commits or rolls back.
#[derive(Default)]
struct Ran {
    statements: std::collections::HashSet<Arc<str>>,
    rolled_back: bool,
}

impl Ran {
    fn add(&mut self, sql: Arc<str>) {
        self.rolled_back |= ends_with_rollback(&sql);
        if self.statements.len() < RAN_MAX {
            self.statements.insert(sql);
        }
    }

    /// Whether a statement's text contains `part`.
    fn contains(&self, part: &str) -> bool {
        self.statements.iter().any(|sql| sql.contains(part))
    }
}

/// A connection's prepared statements and portals, with the text each runs.
#[derive(Default)]
struct Names {
    statements: HashMap<Vec<u8>, Arc<str>>,
    portals: HashMap<Vec<u8>, Arc<str>>,
}

impl Names {
    /// Parse: `name\0 sql\0 ...`.
    fn parse(&mut self, body: &[u8]) {
        let mut fields = strings(body);
        let (Some(name), Some(sql)) = (fields.next(), fields.next()) else {
            return;
        };
        remember(&mut self.statements, name, text(sql).into());
    }

    /// Bind: `portal\0 statement\0 ...`; a portal of an unknown statement is forgotten.
    fn bind(&mut self, body: &[u8]) {
        let mut fields = strings(body);
        let (Some(portal), Some(statement)) = (fields.next(), fields.next()) else {
            return;
        };
        match self.statements.get(statement).cloned() {
            Some(sql) => remember(&mut self.portals, portal, sql),
            None => {
                self.portals.remove(portal);
            }
        }
    }

    /// Execute: `portal\0 max_rows: u32`; the text the portal runs, when known.
    fn executed(&self, body: &[u8]) -> Option<Arc<str>> {
        let portal = strings(body).next().unwrap_or_default();
        self.portals.get(portal).cloned()
    }

    /// Close: `'S'|'P' name\0`.
    fn close(&mut self, body: &[u8]) {
        let Some((&what, rest)) = body.split_first() else {
            return;
        };
        let name = strings(rest).next().unwrap_or_default();
        match what {
            b'S' => self.statements.remove(name),
            b'P' => self.portals.remove(name),
            _ => None,
        };
    }
}

fn remember(names: &mut HashMap<Vec<u8>, Arc<str>>, name: &[u8], sql: Arc<str>) {
    if names.len() >= NAMES_MAX && !names.contains_key(name) {
        names.clear();
    }
    names.insert(name.to_vec(), sql);
}

/// The `host:port` of a `postgres://` URL (port 5432 when it names none), and a function that
/// puts another `host:port` in its place.
fn split_server(url: &str) -> io::Result<(String, impl Fn(&str) -> String + '_)> {
    let bad = || invalid(format!("not a postgres:// URL with a host: {url}"));
    let scheme_end = url.find("://").ok_or_else(bad)? + 3;
    let rest = &url[scheme_end..];
    let authority_len = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let host_start = scheme_end + authority.rfind('@').map_or(0, |at| at + 1);
    let host_end = scheme_end + authority_len;
    let host_port = &url[host_start..host_end];
    if host_port.is_empty() || host_port.contains(',') {
        return Err(bad());
    }
    // `[::1]:5432`, `[::1]`, `host:5432`, `host`.
    let has_port = match host_port.rfind(']') {
        Some(bracket) => host_port[bracket..].contains(':'),
        None => host_port.contains(':'),
    };
    let server = if has_port {
        host_port.to_string()
    } else {
        format!("{host_port}:5432")
    };
    let rebuild =
        move |address: &str| format!("{}{address}{}", &url[..host_start], &url[host_end..]);
    Ok((server, rebuild))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut bytes = vec![kind];
        bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    #[test]
    fn messages_are_cut_at_their_length_and_a_partial_one_waits() {
        let mut bytes = message(b'Q', b"COMMIT\0");
        bytes.extend(message(b'S', b""));
        let first = next_message(&bytes).unwrap().unwrap();
        assert_eq!(
            (first.kind, first.body, first.len),
            (b'Q', &b"COMMIT\0"[..], 12)
        );
        assert_eq!(whole_messages(&bytes).unwrap(), 17);
        assert_eq!(whole_messages(&bytes[..16]).unwrap(), 12);
        assert_eq!(whole_messages(&bytes[..4]).unwrap(), 0);
        assert_eq!(next_message(&bytes[..11]).unwrap(), None);

        let too_short = [b'Q', 0, 0, 0, 3];
        assert!(next_message(&too_short).is_err());
        let too_long = [b'Q', 0x7f, 0xff, 0xff, 0xff];
        let error = next_message(&too_long).unwrap_err().to_string();
        assert!(error.contains("forwards at most"), "{error}");
    }

    #[test]
    fn a_query_commits_when_its_last_statement_does() {
        for sql in [
            "COMMIT",
            "commit;",
            " END ",
            "COMMIT WORK",
            "UPDATE t SET a = 1; COMMIT",
        ] {
            assert!(ends_with_commit(sql), "{sql}");
        }
        for sql in [
            "BEGIN",
            "ROLLBACK",
            "COMMIT; BEGIN",
            "SELECT commit FROM t",
            "RELEASE SAVEPOINT command",
            "",
            ";",
        ] {
            assert!(!ends_with_commit(sql), "{sql}");
        }
    }

    #[test]
    fn an_executed_portal_runs_its_statements_text() {
        let mut names = Names::default();
        let executed = |names: &Names, body: &[u8]| names.executed(body).map(|s| s.to_string());
        names.parse(b"\0COMMIT\0\0\0");
        names.parse(b"s1\0SELECT 1\0\0\0");
        names.bind(b"\0\0\0\0\0\0\0\0");
        assert_eq!(executed(&names, b"\0\0\0\0\0").as_deref(), Some("COMMIT"));
        names.bind(b"p1\0s1\0\0\0");
        assert_eq!(
            executed(&names, b"p1\0\0\0\0\0").as_deref(),
            Some("SELECT 1")
        );
        // The unnamed statement replaced: the unnamed portal bound again runs the new one.
        names.parse(b"\0SELECT 2\0\0\0");
        names.bind(b"\0\0\0\0");
        assert_eq!(executed(&names, b"\0\0\0\0\0").as_deref(), Some("SELECT 2"));
        // A closed portal, a portal bound to an unknown statement: unknown.
        names.parse(b"c\0END\0\0\0");
        names.bind(b"pc\0c\0");
        assert_eq!(executed(&names, b"pc\0\0\0\0\0").as_deref(), Some("END"));
        names.close(b"Ppc\0");
        assert_eq!(executed(&names, b"pc\0\0\0\0\0"), None);
        names.bind(b"p1\0nope\0");
        assert_eq!(executed(&names, b"p1\0"), None);
        // A truncated Bind changes nothing.
        names.bind(b"");
        assert_eq!(executed(&names, b"").as_deref(), Some("SELECT 2"));
    }

    #[test]
    fn a_transaction_remembers_what_it_ran_and_whether_it_rolled_back() {
        let mut ran = Ran::default();
        ran.add("DELETE FROM streams WHERE id = $1".into());
        ran.add("ROLLBACK TO SAVEPOINT command; RELEASE SAVEPOINT command".into());
        assert!(ran.contains("DELETE FROM streams"));
        assert!(!ran.contains("UPDATE nodes"));
        assert!(!ran.rolled_back);
        ran.add("rollback".into());
        assert!(ran.rolled_back);
        for i in 0..RAN_MAX + 10 {
            ran.add(format!("SELECT {i}").into());
        }
        assert_eq!(ran.statements.len(), RAN_MAX);
        assert!(ends_with_rollback("ABORT"));
        assert!(!ends_with_rollback("ROLLBACK TO command"));
    }

    #[test]
    fn names_beyond_the_limit_are_forgotten_not_grown() {
        let mut names = Names::default();
        for i in 0..NAMES_MAX + 10 {
            names.parse(format!("s{i}\0COMMIT\0").as_bytes());
        }
        assert!(names.statements.len() <= NAMES_MAX);
        assert!(names.statements.contains_key(&b"s4105"[..]));
    }

    #[test]
    fn the_server_of_a_url_is_replaced_and_the_rest_kept() {
        let (server, rebuild) =
            split_server("postgres://u:p@127.0.0.1:5432/picomq?connect_timeout=5").unwrap();
        assert_eq!(server, "127.0.0.1:5432");
        assert_eq!(
            rebuild("127.0.0.1:40000"),
            "postgres://u:p@127.0.0.1:40000/picomq?connect_timeout=5"
        );
        let (server, rebuild) = split_server("postgresql://localhost/db").unwrap();
        assert_eq!(server, "localhost:5432");
        assert_eq!(rebuild("127.0.0.1:1"), "postgresql://127.0.0.1:1/db");
        let (server, _) = split_server("postgres://u@[::1]:6000").unwrap();
        assert_eq!(server, "[::1]:6000");
        let (server, _) = split_server("postgres://u:p@host").unwrap();
        assert_eq!(server, "host:5432");
        assert!(split_server("host=127.0.0.1 user=u").is_err());
        assert!(split_server("postgres:///db").is_err());
        assert!(split_server("postgres://a:1,b:2/db").is_err());
    }
}
