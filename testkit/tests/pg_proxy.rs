//! The Postgres fault proxy's threads and faults against a stand-in server that speaks just
//! enough of the wire protocol (startup, simple Query, ReadyForQuery), so they run on every
//! `cargo test`. What the faults do to a real server and the `postgres` crate is in
//! `meta/tests/pg_faults.rs`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pico_testkit::pg_proxy::{Fault, PgProxy};

/// How long a test waits for something that happens at once, at most.
const BOUND: Duration = Duration::from_secs(10);

/// A stand-in server: answers the startup with ReadyForQuery, and every Query with
/// CommandComplete (the statement's first word as the tag) and ReadyForQuery. Records the
/// Queries it received.
struct FakeServer {
    addr: SocketAddr,
    queries: Arc<Mutex<Vec<String>>>,
}

impl FakeServer {
    fn start() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let queries = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&queries);
        // Ends with the test process; serves each connection on a thread of its own.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let recorded = Arc::clone(&recorded);
                std::thread::spawn(move || serve(stream, &recorded));
            }
        });
        FakeServer { addr, queries }
    }

    fn queries(&self) -> Vec<String> {
        self.queries.lock().unwrap().clone()
    }
}

fn serve(mut stream: TcpStream, queries: &Mutex<Vec<String>>) {
    let mut length = [0u8; 4];
    if stream.read_exact(&mut length).is_err() {
        return;
    }
    let mut startup = vec![0u8; u32::from_be_bytes(length) as usize - 4];
    if stream.read_exact(&mut startup).is_err() || stream.write_all(&ready()).is_err() {
        return;
    }
    // One Query per round until the connection ends.
    loop {
        let mut head = [0u8; 5];
        if stream.read_exact(&mut head).is_err() {
            return;
        }
        let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; length - 4];
        if stream.read_exact(&mut body).is_err() {
            return;
        }
        if head[0] != b'Q' {
            continue;
        }
        let sql = String::from_utf8_lossy(&body[..body.len() - 1]).into_owned();
        let tag = sql.split_whitespace().next().unwrap_or("").to_uppercase();
        queries.lock().unwrap().push(sql);
        let mut answer = message(b'C', format!("{tag}\0").as_bytes());
        answer.extend(ready());
        if stream.write_all(&answer).is_err() {
            return;
        }
    }
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

fn ready() -> Vec<u8> {
    message(b'Z', b"I")
}

/// A client of the stand-in: a startup packet, then Queries one at a time.
struct RawClient {
    stream: TcpStream,
}

impl RawClient {
    /// Connects and waits for the startup's ReadyForQuery; with `ssl_first`, asks for SSL
    /// first and expects `N`.
    fn connect(addr: SocketAddr, ssl_first: bool) -> std::io::Result<RawClient> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(BOUND))?;
        if ssl_first {
            stream.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])?;
            let mut answer = [0u8; 1];
            stream.read_exact(&mut answer)?;
            assert_eq!(&answer, b"N", "SSLRequest refused");
        }
        let mut startup = Vec::new();
        startup.extend_from_slice(&(3u32 << 16).to_be_bytes());
        startup.extend_from_slice(b"user\0test\0\0");
        let mut packet = ((startup.len() + 4) as u32).to_be_bytes().to_vec();
        packet.extend(startup);
        stream.write_all(&packet)?;
        let mut client = RawClient { stream };
        assert_eq!(client.read_message()?, (b'Z', b"I".to_vec()));
        Ok(client)
    }

    fn read_message(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        let mut head = [0u8; 5];
        self.stream.read_exact(&mut head)?;
        let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; length - 4];
        self.stream.read_exact(&mut body)?;
        Ok((head[0], body))
    }

    /// Sends a Query; its CommandComplete tag once its ReadyForQuery came.
    fn query(&mut self, sql: &str) -> std::io::Result<String> {
        self.stream
            .write_all(&message(b'Q', format!("{sql}\0").as_bytes()))?;
        let (kind, tag) = self.read_message()?;
        assert_eq!(kind, b'C');
        assert_eq!(self.read_message()?, (b'Z', b"I".to_vec()));
        Ok(String::from_utf8_lossy(&tag[..tag.len() - 1]).into_owned())
    }
}

/// Waits, bounded, until `done`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn statements_and_answers_pass_through_unchanged() {
    let server = FakeServer::start();
    let proxy = PgProxy::start(server.addr).unwrap();
    let mut client = RawClient::connect(proxy.addr(), true).unwrap();
    assert_eq!(client.query("BEGIN").unwrap(), "BEGIN");
    assert_eq!(client.query("select 1").unwrap(), "SELECT");
    assert_eq!(client.query("COMMIT").unwrap(), "COMMIT");
    assert_eq!(server.queries(), ["BEGIN", "select 1", "COMMIT"]);
    let stats = proxy.stats();
    assert_eq!((stats.accepted, stats.turns, stats.commits), (1, 3, 1));
    assert_eq!(stats.commit_answers_lost, 0);
}

#[test]
fn a_lost_commit_answer_reaches_the_server_and_cuts_the_client_without_an_answer() {
    let server = FakeServer::start();
    let proxy = PgProxy::start(server.addr).unwrap();
    let mut client = RawClient::connect(proxy.addr(), false).unwrap();
    proxy.inject(Fault::LoseCommitAnswer);
    assert_eq!(proxy.armed_losses(), 1);
    // A statement that does not commit passes.
    assert_eq!(client.query("BEGIN").unwrap(), "BEGIN");
    let error = client.query("COMMIT").unwrap_err();
    assert!(
        matches!(
            error.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ),
        "{error:?}"
    );
    assert_eq!(server.queries(), ["BEGIN", "COMMIT"]);
    assert_eq!(proxy.lost_answers(), ["COMMIT"]);
    assert_eq!(proxy.stats().commit_answers_lost, 1);
    assert_eq!(proxy.armed_losses(), 0);
    wait_until("the cut connection is forgotten", || {
        proxy.open_connections() == 0
    });

    // Used up: the next COMMIT is answered.
    let mut client = RawClient::connect(proxy.addr(), false).unwrap();
    assert_eq!(client.query("COMMIT").unwrap(), "COMMIT");
}

#[test]
fn a_targeted_loss_waits_for_a_commit_of_a_transaction_that_ran_its_statement() {
    let server = FakeServer::start();
    let proxy = PgProxy::start(server.addr).unwrap();
    let mut client = RawClient::connect(proxy.addr(), false).unwrap();
    proxy.inject(Fault::LoseCommitAnswerAfter("DELETE FROM t"));
    for sql in ["BEGIN", "SELECT 1", "COMMIT"] {
        client.query(sql).unwrap();
    }
    // Rolled back: what it ran does not count for the next transaction.
    for sql in [
        "BEGIN",
        "DELETE FROM t",
        "ROLLBACK",
        "BEGIN",
        "SELECT 2",
        "COMMIT",
    ] {
        client.query(sql).unwrap();
    }
    assert_eq!(proxy.armed_losses(), 1);
    for sql in ["BEGIN", "DELETE FROM t WHERE a = 1", "SELECT 3"] {
        client.query(sql).unwrap();
    }
    assert!(client.query("COMMIT").is_err());
    assert_eq!(proxy.lost_answers(), ["COMMIT"]);
    assert_eq!(proxy.armed_losses(), 0);
    assert_eq!(server.queries().last().map(String::as_str), Some("COMMIT"));
}

#[test]
fn held_answers_and_delayed_statements_arrive_late_and_in_order() {
    let server = FakeServer::start();
    let proxy = PgProxy::start(server.addr).unwrap();
    let mut client = RawClient::connect(proxy.addr(), false).unwrap();
    // Long next to a round trip here, so that "before it ended" is never a race.
    let hold = Duration::from_millis(1000);

    proxy.inject(Fault::HoldAnswers(hold));
    let started = Instant::now();
    client
        .stream
        .write_all(&message(b'Q', b"SELECT 1\0"))
        .unwrap();
    // The server has it at once: only its answer is held.
    while server.queries().is_empty() {
        assert!(
            started.elapsed() < hold,
            "the server did not get it at once"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(client.read_message().unwrap().0, b'C');
    assert!(
        started.elapsed() >= hold,
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(client.read_message().unwrap().0, b'Z');
    assert_eq!(server.queries(), ["SELECT 1"]);

    proxy.inject(Fault::DelayStatements(hold));
    let sent = Instant::now();
    client
        .stream
        .write_all(&message(b'Q', b"INSERT 1\0"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        server.queries(),
        ["SELECT 1"],
        "delayed, not yet at the server"
    );
    assert_eq!(client.read_message().unwrap().0, b'C');
    assert!(
        sent.elapsed() >= hold,
        "answered after {:?}",
        sent.elapsed()
    );
    assert_eq!(client.read_message().unwrap().0, b'Z');
    assert_eq!(server.queries(), ["SELECT 1", "INSERT 1"]);

    // Healed: a hold injected, then ended early.
    proxy.inject(Fault::HoldAnswers(Duration::from_secs(60)));
    proxy.heal();
    assert_eq!(client.query("SELECT 2").unwrap(), "SELECT");
}

#[test]
fn cut_connections_fail_and_new_ones_are_refused_only_while_refusing() {
    let server = FakeServer::start();
    let proxy = PgProxy::start(server.addr).unwrap();
    let mut first = RawClient::connect(proxy.addr(), false).unwrap();
    let mut second = RawClient::connect(proxy.addr(), false).unwrap();
    wait_until("both connections open", || proxy.open_connections() == 2);

    proxy.inject(Fault::CutAll);
    assert!(first.query("SELECT 1").is_err());
    assert!(second.query("SELECT 1").is_err());
    assert_eq!(proxy.stats().cut, 2);
    wait_until("the cut connections are forgotten", || {
        proxy.open_connections() == 0
    });

    proxy.inject(Fault::Refuse(true));
    assert!(RawClient::connect(proxy.addr(), false).is_err());
    assert_eq!(proxy.stats().refused, 1);
    proxy.inject(Fault::Refuse(false));
    let mut third = RawClient::connect(proxy.addr(), false).unwrap();
    assert_eq!(third.query("SELECT 3").unwrap(), "SELECT");
    assert_eq!(proxy.stats().accepted, 3);
}

#[test]
fn dropping_the_proxy_cuts_its_connections_and_stops_listening() {
    let server = FakeServer::start();
    let proxy = PgProxy::start(server.addr).unwrap();
    let addr = proxy.addr();
    let mut client = RawClient::connect(addr, false).unwrap();
    drop(proxy);
    assert!(client.query("SELECT 1").is_err());
    assert!(TcpStream::connect(addr).is_err(), "still listening");
}

#[test]
fn a_server_that_is_down_closes_the_client() {
    // A port nothing listens on: bound, then released.
    let gone = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = PgProxy::start(gone).unwrap();
    assert!(RawClient::connect(proxy.addr(), false).is_err());
}
