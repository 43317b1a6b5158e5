//! What the proxy reads of the wire protocol: message frames, statement texts, and which of
//! them commit or roll back.

use super::*;

/// Bytes read from one side, not forwarded yet.
#[derive(Default)]
pub(super) struct Frames {
    pub(super) buffer: Vec<u8>,
}

impl Frames {
    /// Reads until the buffer starts with at least one whole message; the length of its whole
    /// messages. An end of the stream is an error (`UnexpectedEof`), like a message longer
    /// than [`MESSAGE_BYTES_MAX`]. Bounded: every read adds bytes, and a message's length is.
    pub(super) fn fill(&mut self, from: &mut TcpStream) -> io::Result<usize> {
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

    pub(super) fn consume(&mut self, bytes: usize) {
        self.buffer.drain(..bytes);
    }
}

/// One typed message at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Message<'a> {
    pub(super) kind: u8,
    pub(super) body: &'a [u8],
    /// Its bytes in all, type and length included.
    pub(super) len: usize,
}

/// The message `bytes` starts with; `None` while it is incomplete.
pub(super) fn next_message(bytes: &[u8]) -> io::Result<Option<Message<'_>>> {
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
pub(super) fn whole_messages(bytes: &[u8]) -> io::Result<usize> {
    let mut at = 0;
    while let Some(message) = next_message(&bytes[at..])? {
        at += message.len;
    }
    Ok(at)
}

pub(super) fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// The 0-terminated strings at the start of a message body (the last one may lack its 0).
pub(super) fn strings(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    body.split(|byte| *byte == 0)
}

pub(super) fn text(bytes: &[u8]) -> String {
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
pub(super) fn ends_with_rollback(sql: &str) -> bool {
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
pub(super) struct Ran {
    pub(super) statements: std::collections::HashSet<Arc<str>>,
    pub(super) rolled_back: bool,
}

impl Ran {
    pub(super) fn add(&mut self, sql: Arc<str>) {
        self.rolled_back |= ends_with_rollback(&sql);
        if self.statements.len() < RAN_MAX {
            self.statements.insert(sql);
        }
    }

    /// Whether a statement's text contains `part`.
    pub(super) fn contains(&self, part: &str) -> bool {
        self.statements.iter().any(|sql| sql.contains(part))
    }
}

/// A connection's prepared statements and portals, with the text each runs.
#[derive(Default)]
pub(super) struct Names {
    pub(super) statements: HashMap<Vec<u8>, Arc<str>>,
    pub(super) portals: HashMap<Vec<u8>, Arc<str>>,
}

impl Names {
    /// Parse: `name\0 sql\0 ...`.
    pub(super) fn parse(&mut self, body: &[u8]) {
        let mut fields = strings(body);
        let (Some(name), Some(sql)) = (fields.next(), fields.next()) else {
            return;
        };
        remember(&mut self.statements, name, text(sql).into());
    }

    /// Bind: `portal\0 statement\0 ...`; a portal of an unknown statement is forgotten.
    pub(super) fn bind(&mut self, body: &[u8]) {
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
    pub(super) fn executed(&self, body: &[u8]) -> Option<Arc<str>> {
        let portal = strings(body).next().unwrap_or_default();
        self.portals.get(portal).cloned()
    }

    /// Close: `'S'|'P' name\0`.
    pub(super) fn close(&mut self, body: &[u8]) {
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

pub(super) fn remember(names: &mut HashMap<Vec<u8>, Arc<str>>, name: &[u8], sql: Arc<str>) {
    if names.len() >= NAMES_MAX && !names.contains_key(name) {
        names.clear();
    }
    names.insert(name.to_vec(), sql);
}
