//! The proxy loop: the acceptor, and per connection the statements thread (client to
//! server) and the answers thread (server to client), where the faults act.

use super::*;

/// Accepts until the proxy stops: a loop that sleeps [`POLL`] whenever nothing is waiting.
pub(super) fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
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
pub(super) struct Link {
    pub(super) client: TcpStream,
    pub(super) server: TcpStream,
    pub(super) closed: AtomicBool,
    pub(super) turns: Mutex<Turns>,
    /// Set by a [`Fault::DelayStatementsFrom`] that found its statement here: nothing more
    /// is forwarded to the server until then.
    pub(super) delayed_until: Mutex<Option<Instant>>,
}

/// Which answer belongs to which statement (see the module's doc).
#[derive(Default)]
pub(super) struct Turns {
    /// Turns the client sent after its startup packet (turn 0).
    pub(super) sent: u64,
    /// ReadyForQuery messages the server sent: the server's messages belong to this turn.
    pub(super) answered: u64,
    /// The turn whose answer is lost: a COMMIT taken by [`Fault::LoseCommitAnswer`].
    pub(super) lose: Option<u64>,
}

impl Link {
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Cuts both sockets (waking both threads); whether this call did it.
    pub(super) fn close(&self) -> bool {
        if self.closed.swap(true, Ordering::SeqCst) {
            return false;
        }
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
        true
    }

    /// The client sent one more turn, after the statements of its transaction so far `ran`;
    /// whether its answer is to be lost (then nothing after it is forwarded).
    pub(super) fn sent_turn(&self, shared: &Shared, commits: bool, ran: &Ran) -> bool {
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
pub(super) fn run_link(shared: &Arc<Shared>, client: TcpStream) {
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
        delayed_until: Mutex::new(None),
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
pub(super) enum Ended {
    /// A COMMIT whose answer is to be lost went through; nothing more is forwarded.
    Losing,
}

/// Forwards the client's startup packet, then its messages, to the server. Each round reads
/// at least one byte or ends, and the connection ends it.
pub(super) fn forward_statements(
    shared: &Shared,
    link: &Link,
    mut client: TcpStream,
) -> io::Result<Ended> {
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
        // Bytes of the buffer already written to the server (those before a delayed statement).
        let mut written = 0;
        while at < whole {
            let message = next_message(&frames.buffer[at..whole])?.expect("whole messages");
            let starts = at;
            at += message.len;
            let executed: Option<Arc<str>> = match message.kind {
                b'Q' => Some(text(message.body).into()),
                b'E' => names.executed(message.body),
                _ => None,
            };
            if let Some(delay) = executed.as_deref().and_then(|sql| shared.take_delay(sql)) {
                shared.wait_out(&shared.statements_delayed_until, link);
                server.write_all(&frames.buffer[written..starts])?;
                written = starts;
                extend(&link.delayed_until, delay);
            }
            shared.wait_out(&link.delayed_until, link);
            let turn = match message.kind {
                b'Q' => {
                    let sql: Arc<str> = executed.expect("a Query's text");
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
                    if let Some(sql) = executed {
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
        server.write_all(&frames.buffer[written..forward])?;
        if losing {
            return Ok(Ended::Losing);
        }
        frames.consume(whole);
    }
}

/// Reads the client's startup packet, answering encryption requests with `N` (the client
/// then goes on in the clear); the packet's bytes.
pub(super) fn read_startup(client: &mut TcpStream) -> io::Result<Vec<u8>> {
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
pub(super) fn forward_answers(
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
