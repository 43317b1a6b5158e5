//! `pico consume`: reads streams as a named consumer (docs/consumers.md). Records go to stdout
//! as `read` prints them (`<seq>\t<body>`, with the stream first when there are several);
//! each page is acknowledged once it is printed and flushed, so a crash repeats at most the
//! page in flight (at least once). Between pages the consumer waits on long-polls of every
//! stream it holds, and heartbeats (an empty acknowledgement) keep its lease; a group
//! member learns from every answer which streams it holds now.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use pico_client::{Client, ClientError, ConsumerView, Position, ReadPage};
use tokio::task::JoinSet;

use crate::args::ConsumeArgs;
use crate::Failure;

/// The shortest lease the loop paces itself by (a heartbeat every third of it).
const LEASE_FLOOR_MS: u64 = 300;
/// How long a call is tried again through answers that say "later" (`503`, `429`) and lost
/// connections: a cluster's failover takes about a node lease.
const RETRY_WINDOW: Duration = Duration::from_secs(60);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);

/// Runs `call` until it succeeds, fails for good, or [`RETRY_WINDOW`] has passed. Every call
/// it repeats is idempotent: a read, or an acknowledgement of the same offset.
async fn retrying<T, F, Fut>(mut call: F) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = Instant::now() + RETRY_WINDOW;
    let mut pause = Duration::from_millis(100);
    loop {
        match call().await {
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                let wait = e.retry_after().unwrap_or(pause).min(RETRY_PAUSE_MAX);
                tokio::time::sleep(wait).await;
                pause = (pause * 2).min(RETRY_PAUSE_MAX);
            }
            other => return other,
        }
    }
}

/// Where one held stream stands.
struct Held {
    next_seq: u64,
    closed: bool,
}

pub async fn consume(client: &Client, args: &ConsumeArgs) -> Result<(), Failure> {
    if args.streams.is_empty() {
        return Err(Failure::Usage("name at least one stream to consume".into()));
    }
    if !args.consumer.starts_with('/') {
        return Err(Failure::Usage(format!(
            "--consumer takes a path, such as /{}",
            args.consumer
        )));
    }
    if args.member.is_some() && !args.group {
        return Err(Failure::Usage(
            "--member names a member of a --group".into(),
        ));
    }
    let name = args.consumer.as_str();
    retrying(|| client.consumer_register(name, &args.streams, args.group, args.lease_ttl_ms))
        .await?;
    let member = args.group.then(|| {
        args.member
            .clone()
            .unwrap_or_else(|| format!("{}-{}", host_name(), std::process::id()))
    });
    let (mut token, acquired) = acquire(client, name, member.as_deref()).await?;
    let beat_every = Duration::from_millis(acquired.lease_ttl_ms.max(LEASE_FLOOR_MS) / 3);
    let mut held = BTreeMap::new();
    update_held(&mut held, &acquired);
    let several = args.streams.len() > 1;
    let mut out = io::stdout().lock();
    let (mut records, mut last_beat) = (0u64, Instant::now());
    let work = async {
        loop {
            // Catch up on every held stream, a page at a time, acknowledging each.
            let mut moved = false;
            for stream in held.keys().cloned().collect::<Vec<_>>() {
                let Some(state) = held.get(&stream) else {
                    continue;
                };
                let from = Position::Seq(state.next_seq);
                let page_records = args.page_records.max(1);
                let page =
                    match retrying(|| client.read_at_most(&stream, from.clone(), page_records))
                        .await
                    {
                        // A trim or retention moved the stream's start past this consumer's position
                        // before it read there: what is left begins at the first readable record.
                        Err(e) if e.code() == Some("offset_gone") => {
                            let start = Position::Offset(Position::DS_BEGINNING.into());
                            let page = retrying(|| {
                                client.read_at_most(&stream, start.clone(), page_records)
                            })
                            .await?;
                            let first = page.records.first().map(|r| r.seq);
                            let resumes = match (first, &page.next) {
                                (Some(seq), _) => seq,
                                (None, Position::Seq(seq)) => *seq,
                                _ => state.next_seq,
                            };
                            eprintln!(
                        "pico: {stream}: records {}..{resumes} were trimmed before {name} read \
                         them; it goes on from {resumes}, the stream's first readable record",
                        state.next_seq
                    );
                            if let Some(state) = held.get_mut(&stream) {
                                state.next_seq = state.next_seq.max(resumes);
                            }
                            page
                        }
                        other => other?,
                    };
                let taken = take(&page, args.count.map(|c| c.saturating_sub(records)));
                if let Some(last) = print(&mut out, &stream, several, &page, taken)? {
                    let acked = [(stream.clone(), last)];
                    let view = retrying(|| client.consumer_ack(name, &token, &acked)).await;
                    let view = match view {
                        Err(e) if is_stale(&e) => {
                            // The stream went to another member meanwhile (it resumes from the
                            // last offset acknowledged), or this member's lease lapsed (a pause)
                            // and it left the group: the heartbeat below tells which.
                            held.remove(&stream);
                            last_beat = Instant::now() - beat_every;
                            continue;
                        }
                        other => other?,
                    };
                    records += taken as u64;
                    last_beat = Instant::now();
                    moved = true;
                    update_held(&mut held, &view);
                }
                if let Some(state) = held.get_mut(&stream) {
                    state.closed = page.closed && page.up_to_date && taken == page.records.len();
                }
            }
            if args.count.is_some_and(|count| records >= count) {
                break Ok(());
            }
            if !args.group && !held.is_empty() && held.values().all(|s| s.closed) {
                break Ok(());
            }
            if last_beat.elapsed() >= beat_every {
                let view = match retrying(|| client.consumer_ack(name, &token, &[])).await {
                    Err(e) if is_stale(&e) => {
                        // This incarnation is gone (its lease lapsed, or a newer one of the same
                        // name joined): join again and go on from the acknowledged offsets.
                        let (fresh, view) = acquire(client, name, member.as_deref()).await?;
                        token = fresh;
                        held.clear();
                        view
                    }
                    other => other?,
                };
                update_held(&mut held, &view);
                last_beat = Instant::now();
            }
            if !moved {
                wait_for_records(client, &held, beat_every).await;
            }
        }
    };
    // A signal (Ctrl-C, `kill`, a service manager's stop) ends the work where it waits, and
    // the consumer still releases: a group hands its streams over now, not after the lease.
    let (outcome, signal) = {
        tokio::pin!(work);
        tokio::select! {
            outcome = &mut work => (outcome, None),
            signal = stop_signal() => (Ok(()), Some(signal)),
        }
    };
    out.flush()?;
    // Leaving at once hands a group's streams over now instead of after the lease; should
    // that fail, the lease lapses by itself.
    if let Err(e) = client.consumer_release(name, &token).await {
        eprintln!("pico: the release failed ({e}); the lease lapses by itself");
    }
    let who = member.map_or(String::new(), |m| format!(" as member {m}"));
    eprintln!("consumed {records} records as {name}{who}; acknowledged");
    if let Some(status) = signal {
        std::process::exit(status);
    }
    outcome
}

/// The first SIGINT or SIGTERM, as the exit status a shell reports for it (130, 143).
async fn stop_signal() -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without the handlers the default action (the process ends) stays.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => 130,
        _ = terminate.recv() => 143,
    }
}

/// An ack refused because the stream or the holder moved on: another member holds the
/// stream now, or this incarnation's lease lapsed.
fn is_stale(e: &ClientError) -> bool {
    matches!(e.code(), Some("stale_epoch" | "consumer_not_reading"))
}

/// Acquires the consumer (joins the group as `member`): its token and what it holds.
async fn acquire(
    client: &Client,
    name: &str,
    member: Option<&str>,
) -> Result<(String, ConsumerView), Failure> {
    let view = retrying(|| client.consumer_acquire(name, member)).await?;
    let token = view
        .token
        .clone()
        .ok_or_else(|| Failure::Fatal("the server answered an acquire without a token".into()))?;
    Ok((token, view))
}

/// Takes the streams a group member holds from an answer (a single reader holds them all),
/// keeping where each one stands.
fn update_held(held: &mut BTreeMap<String, Held>, view: &ConsumerView) {
    let cursors = view.assignment.as_ref().unwrap_or(&view.streams);
    held.retain(|stream, _| cursors.iter().any(|c| &c.stream == stream));
    for cursor in cursors {
        let state = held.entry(cursor.stream.clone()).or_insert(Held {
            next_seq: cursor.next_seq,
            closed: false,
        });
        state.next_seq = state.next_seq.max(cursor.next_seq);
    }
}

/// How many of the page's records to print: all, or what is left of `--count`.
fn take(page: &ReadPage, left: Option<u64>) -> usize {
    let all = page.records.len();
    left.map_or(all, |left| {
        all.min(usize::try_from(left).unwrap_or(usize::MAX))
    })
}

/// Prints the first `take` records of `page`; the last sequence printed.
fn print(
    out: &mut impl Write,
    stream: &str,
    several: bool,
    page: &ReadPage,
    take: usize,
) -> Result<Option<u64>, Failure> {
    let mut last = None;
    for record in page.records.iter().take(take) {
        let body = match std::str::from_utf8(&record.body) {
            Ok(text) => text.to_string(),
            Err(_) => format!("{} bytes", record.body.len()),
        };
        if several {
            writeln!(out, "{stream}\t{}\t{body}", record.seq)?;
        } else {
            writeln!(out, "{}\t{body}", record.seq)?;
        }
        last = Some(record.seq);
    }
    out.flush()?;
    Ok(last)
}

/// Waits until one of the held streams has records past where it stands, or `within`.
async fn wait_for_records(client: &Client, held: &BTreeMap<String, Held>, within: Duration) {
    let mut polls = JoinSet::new();
    for (stream, state) in held.iter().filter(|(_, s)| !s.closed) {
        let (client, stream, from) = (client.clone(), stream.clone(), state.next_seq);
        polls.spawn(async move {
            match client
                .read_long_poll(&stream, Position::Seq(from), None)
                .await
            {
                Ok(page) => !page.records.is_empty(),
                Err(_) => false,
            }
        });
    }
    if polls.is_empty() {
        tokio::time::sleep(within).await;
        return;
    }
    let _ = tokio::time::timeout(within, async {
        while let Some(found) = polls.join_next().await {
            if found.unwrap_or(false) {
                return;
            }
        }
        // Every poll answered empty (their timeout, or errors): pause before the next round.
        tokio::time::sleep(within).await;
    })
    .await;
    polls.abort_all();
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "member".into())
}
