//! The stream commands (README.md, "Use it"): data on stdout, acknowledgements and notes on
//! stderr.

use std::io::{self, Write};
use std::time::Duration;

use pico_client::{
    ApiError, Client, ClientError, ErrorKind, Position, Protocol, ReadPage, Retention,
};

use crate::args::{
    CloseArgs, CreateArgs, DeleteArgs, HeadArgs, LsArgs, ReadArgs, RetentionArgs, TailArgs,
    TrimArgs,
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
        from = page.next.clone();
        if page.up_to_date || page.is_empty() {
            if args.follow && !page.closed {
                let mut live = Live {
                    progress,
                    verb: "read",
                    records,
                    bytes,
                };
                return follow(client, &args.stream, from, true, &mut out, &mut live).await;
            }
            end_with_summary(&mut progress, "read", records, bytes, &from);
            return Ok(());
        }
    }
}

/// On a terminal, the progress display ends with `read 1200 records, 34.5 KiB, 0.05s, 24000
/// records/s, 0.7 MiB/s: next=1200 (resume with --from 1200)`.
fn end_with_summary(
    progress: &mut Progress,
    verb: &str,
    records: u64,
    bytes: u64,
    next: &Position,
) {
    if progress.enabled() {
        progress.note(&summary_line(
            verb,
            records,
            bytes,
            progress.elapsed(),
            next,
        ));
    }
}

fn summary_line(
    verb: &str,
    records: u64,
    bytes: u64,
    elapsed: Duration,
    next: &Position,
) -> String {
    format!(
        "{verb} {}, {}: next={next} (resume with --from {next})",
        crate::progress::amount(records, bytes),
        crate::progress::pace(records, bytes, elapsed)
    )
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
    let mut live = Live {
        progress: Progress::new("tailed"),
        verb: "tailed",
        records: 0,
        bytes: 0,
    };
    follow(client, &args.stream, from, args.follow, &mut out, &mut live).await
}

/// What a live read has printed, for its progress display and summary.
struct Live {
    progress: Progress,
    verb: &'static str,
    records: u64,
    bytes: u64,
}

/// Long-polls `stream` from `from`, printing what arrives, until it is up to date
/// (`until_closed` false) or closed; then the summary.
async fn follow(
    client: &Client,
    stream: &str,
    mut from: Position,
    until_closed: bool,
    out: &mut impl Write,
    live: &mut Live,
) -> Result<(), Failure> {
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .read_long_poll(stream, &from, cursor.as_deref())
            .await?;
        let (printed, printed_bytes) = print_page(out, &page)?;
        live.records += printed;
        live.bytes += printed_bytes;
        if until_closed {
            live.progress.update(live.records, live.bytes);
        }
        if page.up_to_date && (page.closed || !until_closed) {
            end_with_summary(
                &mut live.progress,
                live.verb,
                live.records,
                live.bytes,
                &page.next,
            );
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
        write!(
            out,
            "{} start={} next={} closed={}",
            stream.name, stream.start, stream.next, stream.closed
        )?;
        if args.owners {
            match stream.owner_node {
                Some(node) => write!(out, " owner={node}")?,
                None => write!(out, " owner=-")?,
            }
        }
        writeln!(out)?;
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
    use bytes::Bytes;
    use pico_client::Record;

    use super::*;

    #[test]
    fn the_summary_says_where_to_resume() {
        let line = summary_line(
            "read",
            1200,
            35_328,
            Duration::from_millis(50),
            &Position::Seq(1200),
        );
        assert_eq!(
            line,
            "read 1200 records, 34.5 KiB, 0.05s, 24000 records/s, 690.0 KiB/s: next=1200 \
             (resume with --from 1200)"
        );
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
