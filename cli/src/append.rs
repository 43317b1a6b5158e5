//! `pico append`: stdin, one record per line, sent in batches.
//!
//! By default records are grouped into one request per batch, sealed at `--batch-records`
//! records, `--batch-bytes` encoded bytes or `--linger-ms` after the batch's first record,
//! whichever comes first, and the command ends with one summary line on stderr. `--batch N`
//! keeps PicoMQ 0.1's behaviour exactly: groups of N lines, no linger, and a
//! `start=<s> next=<n>` line per request instead of the summary.
//!
//! A thread reads stdin ahead into a bounded channel while a request is in flight; requests
//! go one at a time, in input order, so the records keep the input's order and a failure
//! leaves a clean cut: every line before the failed request is appended, none after it was
//! sent.

use std::io::{self, BufRead};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pico_client::{AppendAck, Client, ClientError, Position, Protocol};
use tokio::sync::mpsc;

use crate::args::AppendArgs;
use crate::progress::{self, Progress};
use crate::Failure;

/// Default records per request.
pub const BATCH_RECORDS_DEFAULT: usize = 1000;
/// Most records per request: the server refuses larger batches.
pub const BATCH_RECORDS_MAX: usize = pico_engine::limits::RECORDS_PER_APPEND_MAX;
/// Default encoded bytes per request.
pub const BATCH_BYTES_DEFAULT: u64 = 1 << 20;
/// Most encoded bytes per request: the server's default `--max-body-size`.
pub const BATCH_BYTES_MAX: u64 = pico_net::BODY_BYTES_MAX_DEFAULT as u64;
/// Default time a batch waits for more input once it has a record.
pub const LINGER_MS_DEFAULT: u64 = 5;
/// Longest `--linger-ms`.
pub const LINGER_MS_MAX: u64 = 60_000;
/// Lines read ahead of the request in flight.
const READ_AHEAD_LINES: usize = 8192;
/// A binary batch's fixed part: version byte and record count.
const BATCH_HEADER_BYTES: u64 = 1 + 4;
/// What a record adds to a binary batch besides its body: header count and body length.
const RECORD_OVERHEAD_BYTES: u64 = 4 + 4;

/// When a batch is sealed and how the command reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    pub records: usize,
    /// Encoded bytes; a record larger than this travels alone.
    pub bytes: u64,
    pub linger: Duration,
    /// `--batch N` (PicoMQ 0.1): a `start= next=` line per request, no summary.
    pub per_request_acks: bool,
}

impl Batching {
    /// The batching `args` ask for, checked against the limits and the protocol.
    pub fn of(args: &AppendArgs, protocol: Protocol) -> Result<Batching, Failure> {
        let tuned = args.batch_records.is_some() || args.batch_bytes.is_some();
        let tuned = tuned || args.linger_ms.is_some() || args.no_batch;
        let batching = match args.batch {
            Some(_) if tuned => {
                return Err(Failure::Usage(
                    "--batch (groups of N lines, one acknowledgement per request) does not mix \
                     with --batch-records, --batch-bytes, --linger-ms or --no-batch"
                        .into(),
                ))
            }
            Some(records) => Batching {
                records: bounded_records(records, "--batch")?,
                bytes: u64::MAX,
                linger: Duration::MAX,
                per_request_acks: true,
            },
            None => {
                let records = match (args.no_batch, args.batch_records) {
                    (true, Some(n)) if n != 1 => {
                        return Err(Failure::Usage(
                            "--no-batch sends one record per request; drop --batch-records".into(),
                        ))
                    }
                    (true, _) => 1,
                    (false, Some(n)) => bounded_records(n, "--batch-records")?,
                    (false, None) if protocol == Protocol::DurableStreams => 1,
                    (false, None) => BATCH_RECORDS_DEFAULT,
                };
                let bytes = args.batch_bytes.unwrap_or(BATCH_BYTES_DEFAULT);
                if bytes == 0 || bytes > BATCH_BYTES_MAX {
                    return Err(Failure::Usage(format!(
                        "--batch-bytes must be 1 to {BATCH_BYTES_MAX} (the server's default \
                         --max-body-size), got {bytes}"
                    )));
                }
                let linger_ms = args.linger_ms.unwrap_or(LINGER_MS_DEFAULT);
                if linger_ms > LINGER_MS_MAX {
                    return Err(Failure::Usage(format!(
                        "--linger-ms must be at most {LINGER_MS_MAX}, got {linger_ms}"
                    )));
                }
                Batching {
                    records,
                    bytes,
                    linger: Duration::from_millis(linger_ms),
                    per_request_acks: false,
                }
            }
        };
        if protocol == Protocol::DurableStreams && batching.records > 1 {
            return Err(Failure::Fatal(
                "the Durable Streams protocol appends one message per request".into(),
            ));
        }
        Ok(batching)
    }
}

fn bounded_records(records: usize, flag: &str) -> Result<usize, Failure> {
    if (1..=BATCH_RECORDS_MAX).contains(&records) {
        Ok(records)
    } else {
        Err(Failure::Usage(format!(
            "{flag} must be 1 to {BATCH_RECORDS_MAX} (the server's limit per request), got \
             {records}"
        )))
    }
}

/// What has been acknowledged so far.
#[derive(Debug, Default)]
struct Acknowledged {
    /// Acknowledgements name where the records start (Pico); a Durable Streams one names only
    /// the offset after them.
    starts_known: bool,
    records: u64,
    bytes: u64,
    requests: u64,
    /// Start of the first acknowledged request, next position after the last.
    first_start: Option<Position>,
    last_next: Option<Position>,
}

impl Acknowledged {
    fn new(protocol: Protocol) -> Acknowledged {
        Acknowledged {
            starts_known: protocol == Protocol::Pico,
            ..Acknowledged::default()
        }
    }

    fn add(&mut self, ack: &AppendAck, records: u64, bytes: u64) {
        self.records += records;
        self.bytes += bytes;
        self.requests += 1;
        if self.starts_known {
            self.first_start.get_or_insert_with(|| ack.start.clone());
        }
        self.last_next = Some(ack.next.clone());
    }

    /// `appended 1000 records, 5.9 KiB in 1 request, 0.01s, 100000 records/s, 0.6 MiB/s:
    /// start=0 next=1000`; `start=` and `next=` as 0.1's per-request line had them.
    fn summary(&self, elapsed: Duration) -> String {
        let requests = match self.requests {
            1 => "1 request".to_string(),
            n => format!("{n} requests"),
        };
        let mut line = format!(
            "appended {} in {requests}, {}",
            progress::amount(self.records, self.bytes),
            progress::pace(self.records, self.bytes, elapsed)
        );
        match (&self.first_start, &self.last_next) {
            (Some(start), Some(next)) => line.push_str(&format!(": start={start} next={next}")),
            (None, Some(next)) => line.push_str(&format!(": next={next}")),
            _ => {}
        }
        line
    }
}

pub async fn append(client: &Client, args: &AppendArgs) -> Result<(), Failure> {
    let batching = Batching::of(args, client.protocol())?;
    let started = Instant::now();
    let mut lines = Lines::from_stdin();
    let mut progress = Progress::new("appended");
    let mut done = Acknowledged::new(client.protocol());
    // Input lines are numbered from 1; `sent_lines` of them went out in acknowledged requests.
    let mut sent_lines: u64 = 0;
    // Durable Streams refuses a record typed unlike its stream: without --content-type, the
    // stream's own type (one HEAD first; a missing stream fails at the first append).
    let content_type = match (client.protocol(), &args.content_type) {
        (Protocol::DurableStreams, None) => client
            .head(&args.stream)
            .await
            .ok()
            .flatten()
            .and_then(|info| info.content_type),
        (_, given) => given.clone(),
    };
    loop {
        let (batch, at_end) = match lines.next_batch(&batching).await {
            Ok(next) => next,
            Err(e) => {
                // Stdin failed: what was read before is either appended or dropped unsent.
                progress.finish();
                if done.requests > 0 {
                    if !batching.per_request_acks {
                        eprintln!("{}", done.summary(started.elapsed()));
                    }
                    eprintln!("input lines 1-{sent_lines} are appended; nothing after was sent");
                }
                return Err(e);
            }
        };
        if !batch.is_empty() {
            let records = batch.len() as u64;
            let bytes: u64 = batch.iter().map(|b| b.len() as u64).sum();
            let ack = match send(client, args, content_type.as_deref(), &batch).await {
                Ok(ack) => ack,
                Err(e) => {
                    progress.finish();
                    if done.requests > 0 {
                        // With `--batch N` the lines per request said it already.
                        if !batching.per_request_acks {
                            eprintln!("{}", done.summary(started.elapsed()));
                        }
                        eprintln!("{}", stopped_at(sent_lines, records, &e));
                    }
                    return Err(e.into());
                }
            };
            done.add(&ack, records, bytes);
            sent_lines += records;
            if batching.per_request_acks {
                progress.note(&format!("start={} next={}", ack.start, ack.next));
            }
            progress.update(done.records, done.bytes);
        }
        if at_end {
            progress.finish();
            if !batching.per_request_acks {
                eprintln!("{}", done.summary(started.elapsed()));
            }
            return Ok(());
        }
    }
}

/// Where a failed append leaves the input: which lines are appended, which were in the failed
/// request, and where to resume.
fn stopped_at(acknowledged_lines: u64, failed_records: u64, error: &ClientError) -> String {
    let first_failed = acknowledged_lines + 1;
    let last_failed = acknowledged_lines + failed_records;
    let fate = match error {
        // The server refused the request as a whole.
        ClientError::Api(refused) if refused.status < 500 => "were not appended",
        // No answer, or a server failure: whether it took effect is not known.
        _ => "may or may not have been appended (pico head shows the tail)",
    };
    let failed = if first_failed == last_failed {
        format!("line {first_failed}")
    } else {
        format!("lines {first_failed}-{last_failed}")
    };
    // The server names a refused record by its place in the request ("record 499: ..."):
    // here that is an input line.
    let culprit = match error {
        ClientError::Api(refused) => refused_record(&refused.message)
            .filter(|record| *record < failed_records)
            .map(|record| format!(" (the server refused input line {})", first_failed + record))
            .unwrap_or_default(),
        _ => String::new(),
    };
    format!(
        "input lines 1-{acknowledged_lines} are appended; {failed}, the failed request, {fate}\
         {culprit}; nothing after line {last_failed} was sent. Resume from line {first_failed}: \
         tail -n +{first_failed} INPUT | pico append ..."
    )
}

/// `N` of a refusal that begins `record N:` (the record's place in its request, from 0).
fn refused_record(message: &str) -> Option<u64> {
    let (number, _) = message.strip_prefix("record ")?.split_once(':')?;
    number.parse().ok()
}

async fn send(
    client: &Client,
    args: &AppendArgs,
    content_type: Option<&str>,
    batch: &[Bytes],
) -> Result<AppendAck, ClientError> {
    match client.protocol() {
        // Pico: one binary batch per request; `--content-type` does not apply.
        Protocol::Pico => client.append_binary_batch(&args.stream, batch).await,
        // Durable Streams: each line raw, typed like the stream (batches hold one record).
        Protocol::DurableStreams => {
            client
                .append_single(&args.stream, batch[0].clone(), content_type)
                .await
        }
    }
}

/// Stdin's lines, read by a thread ahead of the requests, with room for one line taken back
/// (the line that did not fit in a batch opens the next one).
struct Lines {
    /// Closes at the end of the input, or after a read error, which comes through it.
    ahead: mpsc::Receiver<io::Result<Bytes>>,
    held: Option<Bytes>,
}

impl Lines {
    fn from_stdin() -> Lines {
        let (tx, ahead) = mpsc::channel(READ_AHEAD_LINES);
        std::thread::spawn(move || {
            let mut input = io::stdin().lock();
            loop {
                let line = next_line(&mut input).transpose();
                let last = !matches!(line, Some(Ok(_)));
                if let Some(line) = line {
                    if tx.blocking_send(line).is_err() {
                        return;
                    }
                }
                if last {
                    return;
                }
            }
        });
        Lines { ahead, held: None }
    }

    /// The next line, waiting for it until `deadline` (`Ok(None)`: the input ended).
    async fn next_until(&mut self, deadline: Option<tokio::time::Instant>) -> Next {
        if let Some(line) = self.held.take() {
            return Next::Line(line);
        }
        let received = match deadline {
            None => self.ahead.recv().await,
            Some(deadline) => match tokio::time::timeout_at(deadline, self.ahead.recv()).await {
                Ok(received) => received,
                Err(_) => return Next::Lingered,
            },
        };
        match received {
            None => Next::End,
            Some(Ok(line)) => Next::Line(line),
            Some(Err(e)) => Next::Failed(e),
        }
    }

    /// The next batch and whether the input has ended. Waits for a first record, then takes
    /// more until the batch is full by count or bytes, the input ends, or the linger has passed
    /// since the first record.
    async fn next_batch(&mut self, batching: &Batching) -> Result<(Vec<Bytes>, bool), Failure> {
        let mut batch: Vec<Bytes> = Vec::new();
        let first = match self.next_until(None).await {
            Next::Line(line) => line,
            Next::End | Next::Lingered => return Ok((batch, true)),
            Next::Failed(e) => return Err(read_failed(e)),
        };
        let mut encoded = BATCH_HEADER_BYTES.saturating_add(encoded_len(&first));
        batch.push(first);
        // `None`: no linger (`--batch N` waits for N lines, as PicoMQ 0.1 did).
        let deadline = tokio::time::Instant::now().checked_add(batching.linger);
        while batch.len() < batching.records {
            let line = match self.next_until(deadline).await {
                Next::Line(line) => line,
                Next::End => return Ok((batch, true)),
                Next::Lingered => break,
                Next::Failed(e) => return Err(read_failed(e)),
            };
            let len = encoded_len(&line);
            if encoded.saturating_add(len) > batching.bytes {
                self.held = Some(line);
                break;
            }
            encoded += len;
            batch.push(line);
        }
        Ok((batch, false))
    }
}

enum Next {
    Line(Bytes),
    End,
    Lingered,
    Failed(io::Error),
}

fn read_failed(e: io::Error) -> Failure {
    Failure::Fatal(format!("cannot read stdin: {e}"))
}

/// Bytes `line` adds to a binary batch.
fn encoded_len(line: &Bytes) -> u64 {
    RECORD_OVERHEAD_BYTES.saturating_add(line.len() as u64)
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

#[cfg(test)]
mod tests {
    use pico_client::ApiError;

    use super::*;

    fn args(batch: Option<usize>, records: Option<usize>, no_batch: bool) -> AppendArgs {
        AppendArgs {
            stream: "/s".into(),
            content_type: None,
            batch,
            batch_records: records,
            batch_bytes: None,
            linger_ms: None,
            no_batch,
        }
    }

    fn lines_of(input: &[&str], input_ended: bool) -> Lines {
        let (tx, ahead) = mpsc::channel(64);
        for line in input {
            tx.try_send(Ok(Bytes::copy_from_slice(line.as_bytes())))
                .unwrap();
        }
        if !input_ended {
            // Keep the channel open: the input has not ended, only paused.
            std::mem::forget(tx);
        }
        Lines { ahead, held: None }
    }

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
    fn batching_defaults_flags_and_limits() {
        let pico = Protocol::Pico;
        let ds = Protocol::DurableStreams;
        let default = Batching::of(&args(None, None, false), pico).unwrap();
        assert_eq!(
            default,
            Batching {
                records: 1000,
                bytes: 1 << 20,
                linger: Duration::from_millis(5),
                per_request_acks: false,
            }
        );
        assert_eq!(
            Batching::of(&args(None, None, false), ds).unwrap().records,
            1
        );
        assert_eq!(
            Batching::of(&args(None, None, true), pico).unwrap().records,
            1
        );
        let old = Batching::of(&args(Some(3), None, false), pico).unwrap();
        assert!(old.per_request_acks);
        assert_eq!((old.records, old.linger), (3, Duration::MAX));
        for bad in [
            args(Some(3), Some(5), false),
            args(Some(3), None, true),
            args(None, Some(5), true),
            args(None, Some(0), false),
            args(None, Some(BATCH_RECORDS_MAX + 1), false),
            args(Some(BATCH_RECORDS_MAX + 1), None, false),
        ] {
            assert!(
                matches!(Batching::of(&bad, pico), Err(Failure::Usage(_))),
                "{bad:?}"
            );
        }
        let mut big = args(None, None, false);
        big.batch_bytes = Some(BATCH_BYTES_MAX + 1);
        assert!(Batching::of(&big, pico).is_err());
        big.batch_bytes = Some(0);
        assert!(Batching::of(&big, pico).is_err());
        let mut slow = args(None, None, false);
        slow.linger_ms = Some(LINGER_MS_MAX + 1);
        assert!(Batching::of(&slow, pico).is_err());
        assert!(matches!(
            Batching::of(&args(None, Some(2), false), ds),
            Err(Failure::Fatal(_))
        ));
    }

    fn batching(records: usize, bytes: u64, linger_ms: u64) -> Batching {
        Batching {
            records,
            bytes,
            linger: Duration::from_millis(linger_ms),
            per_request_acks: false,
        }
    }

    fn texts(batch: &[Bytes]) -> Vec<&str> {
        batch
            .iter()
            .map(|b| std::str::from_utf8(b).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn batches_seal_by_count_bytes_linger_and_end() {
        // By count, then the rest at the end of the input.
        let mut lines = lines_of(&["a", "b", "c", "d", "e"], true);
        let by_count = batching(2, 1 << 20, 1000);
        let (batch, end) = lines.next_batch(&by_count).await.unwrap();
        assert_eq!((texts(&batch), end), (vec!["a", "b"], false));
        let (batch, end) = lines.next_batch(&by_count).await.unwrap();
        assert_eq!((texts(&batch), end), (vec!["c", "d"], false));
        let (batch, end) = lines.next_batch(&by_count).await.unwrap();
        assert_eq!((texts(&batch), end), (vec!["e"], true));
        let (batch, end) = lines.next_batch(&by_count).await.unwrap();
        assert!(batch.is_empty() && end);

        // By bytes: header 5 + 8 per record + bodies; a line that does not fit opens the next
        // batch, and a line larger than the limit travels alone.
        let mut lines = lines_of(&["1234", "5678", "x", "0123456789abcdef"], true);
        let by_bytes = batching(100, 5 + 12 + 12, 1000);
        let (batch, _) = lines.next_batch(&by_bytes).await.unwrap();
        assert_eq!(texts(&batch), ["1234", "5678"]);
        let (batch, _) = lines.next_batch(&by_bytes).await.unwrap();
        assert_eq!(texts(&batch), ["x"]);
        let (batch, end) = lines.next_batch(&by_bytes).await.unwrap();
        assert_eq!((texts(&batch), end), (vec!["0123456789abcdef"], true));

        // By linger: the input pauses (the channel stays open) and the batch goes after it.
        let mut lines = lines_of(&["p", "q"], false);
        let started = Instant::now();
        let (batch, end) = lines.next_batch(&batching(100, 1 << 20, 20)).await.unwrap();
        assert_eq!((texts(&batch), end), (vec!["p", "q"], false));
        assert!(started.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn a_failure_says_which_lines_are_appended_and_where_to_resume() {
        let refused = ClientError::Api(ApiError::from_status(413, "too large"));
        assert_eq!(
            stopped_at(2000, 1000, &refused),
            "input lines 1-2000 are appended; lines 2001-3000, the failed request, were not \
             appended; nothing after line 3000 was sent. Resume from line 2001: tail -n +2001 \
             INPUT | pico append ..."
        );
        let lost = ClientError::InvalidResponse("connection reset".into());
        assert!(stopped_at(5, 1, &lost).contains("line 6, the failed request, may or may not"));
        let failed = ClientError::Api(ApiError::from_status(503, "unavailable"));
        assert!(stopped_at(5, 2, &failed).contains("lines 6-7, the failed request, may or may"));
    }

    #[test]
    fn the_summary_counts_requests_and_spans_the_positions() {
        let mut done = Acknowledged::new(Protocol::Pico);
        let ack = |start, next| AppendAck {
            start: Position::Seq(start),
            next: Position::Seq(next),
            timestamp: None,
        };
        done.add(&ack(10, 1010), 1000, 6000);
        assert_eq!(
            done.summary(Duration::from_millis(100)),
            "appended 1000 records, 5.9 KiB in 1 request, 0.10s, 10000 records/s, 58.6 KiB/s: \
             start=10 next=1010"
        );
        done.add(&ack(1010, 1011), 1, 1);
        assert!(done
            .summary(Duration::from_secs(1))
            .ends_with("in 2 requests, 1.00s, 1001 records/s, 5.9 KiB/s: start=10 next=1011"));
        assert_eq!(
            Acknowledged::new(Protocol::Pico).summary(Duration::ZERO),
            "appended 0 records, 0 B in 0 requests, 0.00s"
        );
        let mut ds = Acknowledged::new(Protocol::DurableStreams);
        let offset = Position::from("0000000000000001_0000000000000003");
        let ds_ack = AppendAck {
            start: offset.clone(),
            next: offset,
            timestamp: None,
        };
        ds.add(&ds_ack, 1, 3);
        assert!(ds
            .summary(Duration::ZERO)
            .ends_with(": next=0000000000000001_0000000000000003"));
    }
}
