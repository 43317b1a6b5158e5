//! The stream commands (README.md, "Use it"): data on stdout, acknowledgements and notes on
//! stderr.

use std::io::{self, BufRead, Write};
use std::time::Duration;

use bytes::Bytes;
use pico_client::{
    ApiError, Client, ClientError, ErrorKind, Position, Protocol, ReadPage, Retention,
};

use crate::args::{
    AppendArgs, CloseArgs, CreateArgs, DeleteArgs, HeadArgs, LsArgs, ReadArgs, RetentionArgs,
    TailArgs, TrimArgs,
};
use crate::progress::Progress;
use crate::Failure;

/// Pause after an empty long-poll answer, so a server that answers at once cannot make
/// `tail -f` spin.
const EMPTY_PAGE_PAUSE: Duration = Duration::from_millis(100);

pub async fn create(client: &Client, args: &CreateArgs) -> Result<(), Failure> {
    let retention = Retention {
        age_secs: args.retention_age,
        bytes: args.retention_bytes,
        delete_on_empty_secs: args.delete_on_empty,
    };
    let created = client
        .create_retained(
            &args.stream,
            args.content_type.as_deref(),
            args.ttl,
            &retention,
        )
        .await?;
    eprintln!("created={created}");
    Ok(())
}

pub async fn retention(client: &Client, args: &RetentionArgs) -> Result<(), Failure> {
    let asked = Retention {
        age_secs: args.age,
        bytes: args.bytes,
        delete_on_empty_secs: args.delete_on_empty,
    };
    let now = client.set_retention(&args.stream, &asked).await?;
    let shown = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "age={} bytes={} delete_on_empty={}",
        shown(now.age_secs),
        shown(now.bytes),
        shown(now.delete_on_empty_secs)
    )?;
    out.flush()?;
    Ok(())
}

pub async fn head(client: &Client, args: &HeadArgs) -> Result<(), Failure> {
    let info = head_or_not_found(client, &args.stream).await?;
    let content_type = info.content_type.as_deref().unwrap_or("-");
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "start={} next={} closed={} type={content_type}",
        info.start, info.next, info.closed
    )?;
    out.flush()?;
    Ok(())
}

pub async fn append(client: &Client, args: &AppendArgs) -> Result<(), Failure> {
    if client.protocol() == Protocol::DurableStreams && args.batch > 1 {
        return Err(Failure::Fatal(
            "the Durable Streams protocol appends one message per request".into(),
        ));
    }
    let mut input = io::stdin().lock();
    let mut batch: Vec<Bytes> = Vec::with_capacity(args.batch.min(4096));
    let mut progress = Progress::new("appended");
    let (mut records, mut bytes) = (0u64, 0u64);
    loop {
        let line = next_line(&mut input)?;
        let at_end = line.is_none();
        batch.extend(line);
        if batch.len() == args.batch || (at_end && !batch.is_empty()) {
            let ack = match client.protocol() {
                // Pico: one binary batch per request; `--content-type` does not apply.
                Protocol::Pico => client.append_binary_batch(&args.stream, &batch).await?,
                // Durable Streams: each line raw, typed like the stream (batch is 1 here).
                Protocol::DurableStreams => {
                    let body = batch[0].clone();
                    client
                        .append_single(&args.stream, body, args.content_type.as_deref())
                        .await?
                }
            };
            progress.note(&format!("start={} next={}", ack.start, ack.next));
            records += batch.len() as u64;
            bytes += batch.iter().map(|b| b.len() as u64).sum::<u64>();
            progress.update(records, bytes);
            batch.clear();
        }
        if at_end {
            return Ok(());
        }
    }
}

/// One line of stdin without its `\n` (or `\r\n`, as `BufRead::lines` strips); bytes, not
/// text, so any input can be appended. `None` at the end of input.
fn next_line(input: &mut impl BufRead) -> io::Result<Option<Bytes>> {
    let mut line = Vec::new();
    if input.read_until(b'\n', &mut line)? == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    Ok(Some(Bytes::from(line)))
}

pub async fn read(client: &Client, args: &ReadArgs) -> Result<(), Failure> {
    let mut from = match args.from.as_deref() {
        None => client.beginning(),
        Some(position) => parse_position(client, &args.stream, position).await?,
    };
    let mut out = io::stdout().lock();
    let mut progress = Progress::new("read");
    let (mut records, mut bytes) = (0u64, 0u64);
    loop {
        let page = client.read(&args.stream, &from).await?;
        let (printed, printed_bytes) = print_page(&mut out, &page)?;
        records += printed;
        bytes += printed_bytes;
        progress.update(records, bytes);
        if page.up_to_date || page.is_empty() {
            if args.follow && !page.closed {
                drop(progress);
                return follow(client, &args.stream, page.next, true, &mut out).await;
            }
            return Ok(());
        }
        from = page.next;
    }
}

/// `--from`. Pico: a sequence; negative means the beginning and `now` the tail, as on the
/// wire. Durable Streams: an offset (`-1`, `now` or one a read printed), passed through for
/// the server to judge.
async fn parse_position(
    client: &Client,
    stream: &str,
    position: &str,
) -> Result<Position, Failure> {
    if client.protocol() == Protocol::DurableStreams {
        return Ok(Position::from(position));
    }
    if position.eq_ignore_ascii_case("now") {
        return Ok(head_or_not_found(client, stream).await?.next);
    }
    let seq = match position.parse::<i64>() {
        // The server's beginning: a trimmed stream's first readable record.
        Ok(n) if n < 0 => return Ok(client.beginning()),
        Ok(n) => n as u64,
        Err(_) => position.parse::<u64>().map_err(|_| {
            Failure::Usage(format!(
                "invalid --from {position:?}: expected a sequence number, -1 or now"
            ))
        })?,
    };
    Ok(Position::Seq(seq))
}

pub async fn tail(client: &Client, args: &TailArgs) -> Result<(), Failure> {
    let from = match client.protocol() {
        Protocol::Pico => head_or_not_found(client, &args.stream).await?.next,
        // The protocol has a sentinel for the tail: no HEAD round trip (nor its race).
        Protocol::DurableStreams => Position::ds_now(),
    };
    let mut out = io::stdout().lock();
    follow(client, &args.stream, from, args.follow, &mut out).await
}

/// Long-polls `stream` from `from`, printing what arrives, until it is up to date (`until_closed`
/// false) or closed.
async fn follow(
    client: &Client,
    stream: &str,
    mut from: Position,
    until_closed: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .read_long_poll(stream, &from, cursor.as_deref())
            .await?;
        print_page(out, &page)?;
        if page.up_to_date && (page.closed || !until_closed) {
            return Ok(());
        }
        if page.is_empty() {
            tokio::time::sleep(EMPTY_PAGE_PAUSE).await;
        }
        from = page.next;
        cursor = page.cursor.or(cursor);
    }
}

async fn head_or_not_found(
    client: &Client,
    stream: &str,
) -> Result<pico_client::StreamInfo, Failure> {
    client
        .head(stream)
        .await?
        .ok_or_else(|| not_found(client.protocol()))
}

/// A `HEAD` that found nothing (its answer has no body), said as a `GET` of the stream says it
/// (`pico read`): `not_found (404): no such stream`, `NOT_FOUND` with Durable Streams.
fn not_found(protocol: Protocol) -> Failure {
    let code = match protocol {
        Protocol::Pico => "not_found",
        Protocol::DurableStreams => "NOT_FOUND",
    };
    let error = ApiError {
        kind: ErrorKind::NotFound,
        status: 404,
        code: code.into(),
        message: "no such stream".into(),
        next: None,
        retry_after: None,
    };
    ClientError::Api(error).into()
}

pub async fn ls(client: &Client, args: &LsArgs) -> Result<(), Failure> {
    let prefix = args.prefix.as_deref().unwrap_or("/");
    let list = client.list(Some(prefix), None, Some(args.limit)).await?;
    let mut out = io::stdout().lock();
    for stream in &list.streams {
        writeln!(
            out,
            "{} start={} next={} closed={}",
            stream.name, stream.start, stream.next, stream.closed
        )?;
    }
    out.flush()?;
    if list.has_more {
        eprintln!("more streams available, raise --limit");
    }
    Ok(())
}

pub async fn trim(client: &Client, args: &TrimArgs) -> Result<(), Failure> {
    let start = client.trim(&args.stream, args.seq).await?;
    eprintln!("trimmed start={start}");
    Ok(())
}

pub async fn close(client: &Client, args: &CloseArgs) -> Result<(), Failure> {
    let next = client.close(&args.stream).await?;
    eprintln!("closed next={next}");
    Ok(())
}

pub async fn delete(client: &Client, args: &DeleteArgs) -> Result<(), Failure> {
    let deleted = client.delete(&args.stream).await?;
    eprintln!("deleted={deleted}");
    Ok(())
}

/// `<position>\t<body>` per record (per chunk with Durable Streams, at the chunk's next
/// offset); bodies that are not UTF-8 print as `<N bytes>`. Flushed per page so `tail -f`
/// output appears as it arrives. Returns the entries and body bytes printed.
fn print_page(out: &mut impl Write, page: &ReadPage) -> io::Result<(u64, u64)> {
    let (mut entries, mut bytes) = (0u64, 0u64);
    for (position, body) in page.entries() {
        match std::str::from_utf8(body) {
            Ok(text) => writeln!(out, "{position}\t{text}")?,
            Err(_) => writeln!(out, "{position}\t{} bytes", body.len())?,
        }
        entries += 1;
        bytes += body.len() as u64;
    }
    out.flush()?;
    Ok((entries, bytes))
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        match e {
            // No answer at all: `main` says what to check and where the endpoint came from.
            ClientError::Transport(_) => Failure::Unreachable(e.to_string()),
            ClientError::InvalidResponse(ref message) => {
                Failure::Fatal(format!("{e}{}", other_protocol_hint(message)))
            }
            e => Failure::Fatal(e.to_string()),
        }
    }
}

/// An answer without the protocol's own headers most often comes from the other protocol's
/// listener (the server refuses what it can recognise with a `400` naming the right one; an
/// answer to a request both protocols share cannot be refused): say so.
fn other_protocol_hint(message: &str) -> &'static str {
    if message.contains("missing pico-") {
        "; the endpoint answered without Pico headers: is it a Durable Streams listener? Use \
         --protocol ds there, or the node's Pico listener (port 4437 by default)"
    } else if message.contains("missing stream-") {
        "; the endpoint answered without Durable Streams headers: is it a Pico listener? Use \
         --protocol pico there, or the node's Durable Streams listener (port 4438 by default)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use pico_client::Record;

    use super::*;

    #[test]
    fn lines_lose_their_terminators_only() {
        let mut input: &[u8] = b"a\nb\r\n\nlast";
        let mut lines = Vec::new();
        while let Some(line) = next_line(&mut input).unwrap() {
            lines.push(line);
        }
        assert_eq!(
            lines,
            vec![
                Bytes::from("a"),
                Bytes::from("b"),
                Bytes::new(),
                Bytes::from("last")
            ]
        );
        let mut empty: &[u8] = b"";
        assert_eq!(next_line(&mut empty).unwrap(), None);
    }

    #[test]
    fn pages_print_as_position_tab_body() {
        let page = ReadPage {
            records: vec![
                Record {
                    seq: 0,
                    body: Bytes::from("1"),
                    ..Record::default()
                },
                Record {
                    seq: 1,
                    body: Bytes::from_static(&[0xff, 0xfe, 0]),
                    ..Record::default()
                },
            ],
            ..ReadPage::default()
        };
        let mut out = Vec::new();
        assert_eq!(print_page(&mut out, &page).unwrap(), (2, 4));
        assert_eq!(out, b"0\t1\n1\t3 bytes\n");
    }

    #[test]
    fn a_durable_streams_chunk_prints_at_its_next_offset() {
        let next = "0000000000000002_0000000000000000";
        let page = ReadPage {
            chunk: Some(Bytes::from("ab")),
            next: Position::from(next),
            ..ReadPage::default()
        };
        let mut out = Vec::new();
        assert_eq!(print_page(&mut out, &page).unwrap(), (1, 2));
        assert_eq!(out, format!("{next}\tab\n").as_bytes());
        let empty = ReadPage {
            next: Position::from(next),
            ..ReadPage::default()
        };
        let mut out = Vec::new();
        assert_eq!(print_page(&mut out, &empty).unwrap(), (0, 0));
        assert!(out.is_empty());
    }
}
