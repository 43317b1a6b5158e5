//! Just enough HTTP/1.1 for a live read: the response head, then a body framed by
//! `Content-Length`, `chunked`, or the end of the connection, handed over as payload slices.

use std::time::Instant;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Largest response head accepted.
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Headers parsed per response.
const HEADERS_MAX: usize = 32;
/// Longest chunk-size line (with extensions).
const CHUNK_LINE_BYTES_MAX: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

#[derive(Debug)]
pub(super) struct Head {
    pub status: u16,
    pub framing: Framing,
    pub keep_alive: bool,
    pub pico_next_seq: Option<u64>,
    pub ds_next_offset: Option<String>,
    pub cursor: Option<String>,
}

/// Parses a complete head at the front of `buf`: the head and its length, `None` if more
/// bytes are needed.
pub(super) fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}")),
    };
    let status = response.code.unwrap_or(0);
    let mut head = Head {
        status,
        framing: Framing::UntilClose,
        keep_alive: response.version == Some(1),
        pico_next_seq: None,
        ds_next_offset: None,
        cursor: None,
    };
    let text = |v: &[u8]| std::str::from_utf8(v).unwrap_or("").trim().to_owned();
    for h in response.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n = text(h.value)
                .parse::<u64>()
                .map_err(|_| "bad Content-Length".to_string())?;
            head.framing = Framing::Length(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if text(h.value).to_ascii_lowercase().ends_with("chunked") {
                head.framing = Framing::Chunked;
            }
        } else if name.eq_ignore_ascii_case("connection") {
            let v = text(h.value).to_ascii_lowercase();
            if v.contains("close") {
                head.keep_alive = false;
            }
        } else if name.eq_ignore_ascii_case(pico_proto::header::PICO_NEXT_SEQ) {
            head.pico_next_seq = text(h.value).parse().ok();
        } else if name.eq_ignore_ascii_case("stream-next-offset") {
            head.ds_next_offset = Some(text(h.value));
        } else if name.eq_ignore_ascii_case("stream-cursor")
            || name.eq_ignore_ascii_case(pico_proto::header::PICO_CURSOR)
        {
            head.cursor = Some(text(h.value));
        }
    }
    if status == 204 || status == 304 {
        head.framing = Framing::Length(0);
    }
    if head.framing == Framing::UntilClose {
        head.keep_alive = false;
    }
    Ok(Some((head, len)))
}

/// Reads until a whole head is in `buf`, parses it and removes it from `buf`.
pub(super) async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Head, String> {
    loop {
        if let Some((head, len)) = parse_head(buf)? {
            buf.drain(..len);
            return Ok(head);
        }
        if buf.len() >= HEAD_BYTES_MAX {
            return Err("response head too large".into());
        }
        let n = stream
            .read_buf(buf)
            .await
            .map_err(|e| format!("read a live response: {e}"))?;
        if n == 0 {
            return Err("connection closed before a response".into());
        }
    }
}

/// The `chunked` decoder's state between reads.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Chunked {
    state: ChunkState,
    size: u64,
    line_bytes: usize,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum ChunkState {
    #[default]
    Size,
    /// After the digits: extensions up to the line end.
    SizeRest,
    Data(u64),
    DataEnd,
    Trailer {
        empty_line: bool,
    },
    Done,
}

impl Chunked {
    /// Decodes from `input`, handing payload to `out`; returns the bytes consumed (all of
    /// them unless the body ended inside `input`).
    pub(super) fn decode(
        &mut self,
        input: &[u8],
        out: &mut impl FnMut(&[u8]),
    ) -> Result<usize, String> {
        let mut i = 0;
        while i < input.len() {
            match self.state {
                ChunkState::Done => return Ok(i),
                ChunkState::Data(rest) => {
                    let take = (input.len() - i).min(usize::try_from(rest).unwrap_or(usize::MAX));
                    out(&input[i..i + take]);
                    i += take;
                    let rest = rest - take as u64;
                    self.state = if rest == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(rest)
                    };
                    continue;
                }
                _ => {}
            }
            let b = input[i];
            i += 1;
            self.line_bytes += 1;
            if self.line_bytes > CHUNK_LINE_BYTES_MAX {
                return Err("chunk line too long".into());
            }
            match self.state {
                ChunkState::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let digit = (b as char).to_digit(16).unwrap_or(0) as u64;
                        self.size = self
                            .size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(digit))
                            .ok_or("chunk size overflows")?;
                    }
                    b'\n' => self.end_size_line(),
                    _ => self.state = ChunkState::SizeRest,
                },
                ChunkState::SizeRest => {
                    if b == b'\n' {
                        self.end_size_line();
                    }
                }
                ChunkState::DataEnd => {
                    if b == b'\n' {
                        self.state = ChunkState::Size;
                        self.size = 0;
                        self.line_bytes = 0;
                    } else if b != b'\r' {
                        return Err("chunk not followed by CRLF".into());
                    }
                }
                ChunkState::Trailer { empty_line } => {
                    if b == b'\n' {
                        if empty_line {
                            self.state = ChunkState::Done;
                            return Ok(i);
                        }
                        self.line_bytes = 0;
                        self.state = ChunkState::Trailer { empty_line: true };
                    } else if b != b'\r' {
                        self.state = ChunkState::Trailer { empty_line: false };
                    }
                }
                ChunkState::Data(_) | ChunkState::Done => unreachable!("handled above"),
            }
        }
        Ok(i)
    }

    fn end_size_line(&mut self) {
        self.line_bytes = 0;
        self.state = if self.size == 0 {
            ChunkState::Trailer { empty_line: true }
        } else {
            ChunkState::Data(self.size)
        };
    }

    pub(super) fn done(&self) -> bool {
        self.state == ChunkState::Done
    }
}

/// Reads the body (starting with what `buf` already holds), calling `on_payload` with each
/// piece and the instant its read returned. Leaves in `buf` what follows the body.
pub(super) async fn read_body(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    framing: Framing,
    mut on_payload: impl FnMut(&[u8], Instant),
) -> Result<(), String> {
    let mut now = Instant::now();
    let mut chunked = Chunked::default();
    let mut remaining = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    loop {
        match framing {
            Framing::Length(_) | Framing::UntilClose => {
                let take = buf
                    .len()
                    .min(usize::try_from(remaining).unwrap_or(usize::MAX));
                if take > 0 {
                    on_payload(&buf[..take], now);
                    buf.drain(..take);
                    if framing != Framing::UntilClose {
                        remaining -= take as u64;
                    }
                }
                if remaining == 0 {
                    return Ok(());
                }
            }
            Framing::Chunked => {
                let mut out = |p: &[u8]| on_payload(p, now);
                let used = chunked.decode(buf, &mut out)?;
                buf.drain(..used);
                if chunked.done() {
                    return Ok(());
                }
            }
        }
        let n = stream
            .read_buf(buf)
            .await
            .map_err(|e| format!("read a live response: {e}"))?;
        now = Instant::now();
        if n == 0 {
            return if framing == Framing::UntilClose {
                Ok(())
            } else {
                Err("connection closed inside a response".into())
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nStream-Next-Offset: 0_5\r\nStream-Cursor: 9\r\n\r\nrest";
        let (head, len) = parse_head(raw).unwrap().unwrap();
        assert_eq!(&raw[len..], b"rest");
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.keep_alive);
        assert_eq!(head.ds_next_offset.as_deref(), Some("0_5"));
        assert_eq!(head.cursor.as_deref(), Some("9"));
        let (head, _) = parse_head(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            (head.status, head.framing, head.keep_alive),
            (204, Framing::Length(0), false)
        );
        let (head, _) = parse_head(b"HTTP/1.1 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!(
            (head.framing, head.keep_alive),
            (Framing::UntilClose, false)
        );
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn chunked_bodies_in_any_split() {
        let body = b"5;ext=1\r\nhello\r\nB\r\n, world! 12\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        // Every split inside the body (what follows it, NEXT, is never handed over).
        for split in 0..=body.len() - 4 {
            let mut chunked = Chunked::default();
            let mut payload = Vec::new();
            let mut out = |p: &[u8]| payload.extend_from_slice(p);
            let first = chunked.decode(&body[..split], &mut out).unwrap();
            assert_eq!(first, split);
            let second = chunked.decode(&body[split..], &mut out).unwrap();
            assert!(chunked.done(), "split {split}");
            assert_eq!(&body[split + second..], b"NEXT");
            assert_eq!(payload, b"hello, world! 12");
        }
        let mut chunked = Chunked::default();
        assert!(chunked
            .decode(b"ffffffffffffffffff\r\n", &mut |_| {})
            .is_err());
        let mut chunked = Chunked::default();
        assert!(chunked.decode(b"1\r\naXY", &mut |_| {}).is_err());
    }
}
