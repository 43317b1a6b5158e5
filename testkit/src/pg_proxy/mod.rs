//! A fault proxy in front of Postgres, for tests: it forwards each client connection to the
//! real server and, when a test says so, loses the answer to a COMMIT (the server committed,
//! the client sees its connection cut: the outcome is unknown to it), holds the server's
//! answers, delays the client's statements (all of them, or one connection's from a given
//! statement on), cuts every open connection, or refuses new ones.
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
//!
//! Files: this one holds the handle ([`PgProxy`], [`Fault`], [`Stats`]); `fault.rs` the state
//! the handle and the threads share (armed faults, holds, open connections, counts);
//! `link.rs` the acceptor and the two threads of each connection; `wire.rs` the protocol
//! frames and statement texts.

mod fault;
mod link;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fault::*;
use link::*;
pub use wire::ends_with_commit;
use wire::*;

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
    /// The next statement (on any connection) whose text contains this, and everything its
    /// connection sends after it, reach the server this much later (a Query's text, or a
    /// prepared statement's when a portal Executes it). Statements sent before it, on that
    /// connection and the others, go on: one client is held at one point (a node's
    /// registration, say) while the others run.
    DelayStatementsFrom(&'static str, Duration),
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
            armed_delays: Mutex::new(Vec::new()),
            delays_started: AtomicU64::new(0),
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
            Fault::DelayStatementsFrom(statement, period) => {
                lock(&shared.armed_delays).push((statement, period));
            }
            Fault::CutAll => shared.cut_all(),
            Fault::Refuse(refuse) => shared.refuse.store(refuse, Ordering::SeqCst),
        }
    }

    /// Ends every fault still in force: armed losses, holds and delays (a connection held by
    /// [`Fault::DelayStatementsFrom`] goes on at once), refusing.
    pub fn heal(&self) {
        let shared = &self.shared;
        shared.armed_losses.store(0, Ordering::SeqCst);
        lock(&shared.armed_after).clear();
        self.heal_delays();
        *lock(&shared.answers_held_until) = None;
        *lock(&shared.statements_delayed_until) = None;
        shared.refuse.store(false, Ordering::SeqCst);
    }

    /// Takes back the [`Fault::DelayStatementsFrom`]s that found no statement yet, and ends
    /// the delays of connections one of them holds.
    pub fn heal_delays(&self) {
        let shared = &self.shared;
        lock(&shared.armed_delays).clear();
        for link in lock(&shared.links).values() {
            *lock(&link.delayed_until) = None;
        }
    }

    /// How many [`Fault::DelayStatementsFrom`]s found their statement (their delay began).
    pub fn delays_started(&self) -> u64 {
        self.shared.delays_started.load(Ordering::SeqCst)
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
