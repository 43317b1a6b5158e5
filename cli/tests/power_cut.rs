//! The power-cut test (docs/durability.md, "How it is tested"): `pico serve` runs in a qemu
//! virtual machine whose disk keeps only what the guest flushed (`power_cut/vm.rs`), writers
//! and readers work against it from this process, and the power is cut at a random moment:
//! the disk's unflushed cache is dropped, then the machine stops. After each reboot
//! `pico_testkit::history::check` holds the whole history so far (every cycle's) against a
//! complete read of each stream: every acknowledged append exactly once at its acknowledged
//! offset (so no offset is handed out twice), dense offsets, nothing never sent, readers never
//! going back, nothing served to a reader and then lost, an idempotent producer's retries
//! across a cut stored at most once.
//!
//! `kill -9` cannot show any of this: the kernel's page cache outlives the process, so a write
//! acknowledged before its `fdatasync`, a missing directory sync or a rename never made durable
//! all survive it. Only losing the disk's cache does.
//!
//! Writers: two plain Pico writers on one stream, an idempotent producer (`Pico-Producer-*`
//! headers, resending a sequence number with the same body until it gets a `2xx`) on another,
//! and a long-poll reader on each. Segments are small and young (`--segment-size 65536
//! --segment-max-age-ms 200`), so a cut often lands in a seal, an object write and its rename,
//! or a catalog commit.
//!
//! Cases: `--durability local` (the single node's default) and `--durability object` on
//! `file://`, each for `POWER_CUT_CYCLES` cycles (default 3; the long run is
//! `POWER_CUT_CYCLES=200`). Two controls must see a loss, or the test fails: a disk that
//! ignores flushes, and `--durability memory` (acknowledged before any `fdatasync`). Each
//! control stops at its first cycle with a loss. `POWER_CUT_SEED` replays a schedule of cut
//! times (thread timing still varies).
//!
//!     scripts/power-cut-vm.sh     # once: qemu, nbdkit, busybox, a kernel
//!     cargo test -p pico-cli --test power_cut -- --include-ignored --nocapture
//!     POWER_CUT_CYCLES=200 cargo test -p pico-cli --test power_cut -- --include-ignored --nocapture
//!
//! Without qemu, nbdkit or the kernel the tests skip with a note; under `CI=true` they fail.

mod common;
#[path = "power_cut/vm.rs"]
mod vm;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{decode_binary_read, Conn, Resp, XorShift};
use pico_testkit::history::{check, Append, History, Outcome, Read, Violation};
use vm::{DiskCache, Kit, Machine, Node};

/// Two plain writers and a reader.
const PLAIN_STREAM: &str = "/power/plain";
/// An idempotent producer and a reader.
const PRODUCER_STREAM: &str = "/power/producer";
const PRODUCER_ID: &str = "power-cut";
/// Bytes of padding per record: about 150 records fill a 64 KiB segment.
const PAD: usize = 400;
/// How long the clients write before a cut: a random time in this range (ms).
const WRITE_MS: (u64, u64) = (1000, 4000);
/// Cycles of each durable case unless `POWER_CUT_CYCLES` says.
const CYCLES_DEFAULT: u32 = 3;
/// A control that has seen no loss after this many cycles fails.
const CONTROL_CYCLES_MAX: u32 = 3;
/// A client waits this long for an answer (a request in flight at a cut fails at once: qemu's
/// end of the forwarded connection goes with it).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a full read of a stream after a reboot may take.
const READ_BOUND: Duration = Duration::from_secs(120);

/// Small segments sealed young: cuts land in seals, object writes, renames, catalog commits.
const SMALL_SEGMENTS: [&str; 4] = ["--segment-size", "65536", "--segment-max-age-ms", "200"];

#[ignore = "needs qemu, nbdkit and a kernel: scripts/power-cut-vm.sh"]
#[test]
fn local_durability_keeps_every_acknowledged_append_through_power_cuts() {
    run_durable_case(
        "local_durability_keeps_every_acknowledged_append_through_power_cuts",
        "local",
        &["--durability", "local"],
    );
}

#[ignore = "needs qemu, nbdkit and a kernel: scripts/power-cut-vm.sh"]
#[test]
fn object_durability_keeps_every_acknowledged_append_through_power_cuts() {
    run_durable_case(
        "object_durability_keeps_every_acknowledged_append_through_power_cuts",
        "object",
        &["--durability", "object"],
    );
}

/// The control of the disk: with flushes ignored, nothing the node wrote since the boot is
/// on the disk after a cut, and the test must see that.
#[ignore = "needs qemu, nbdkit and a kernel: scripts/power-cut-vm.sh"]
#[test]
fn control_a_disk_that_ignores_flushes_loses_acknowledged_appends() {
    run_control_case(
        "control_a_disk_that_ignores_flushes_loses_acknowledged_appends",
        "ignores-flushes",
        &["--durability", "local"],
        DiskCache::IgnoresFlushes,
    );
}

/// The control of the node: `--durability memory` acknowledges before any `fdatasync`, so a
/// cut loses what was not uploaded yet, and the test must see that.
#[ignore = "needs qemu, nbdkit and a kernel: scripts/power-cut-vm.sh"]
#[test]
fn control_memory_durability_loses_acknowledged_appends() {
    run_control_case(
        "control_memory_durability_loses_acknowledged_appends",
        "memory",
        &["--durability", "memory"],
        DiskCache::Writeback,
    );
}

fn run_durable_case(test: &str, name: &str, flags: &[&str]) {
    let Some(kit) = Kit::find(test) else {
        return;
    };
    let cycles = std::env::var("POWER_CUT_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CYCLES_DEFAULT);
    let mut run = Run::start(&kit, name, flags, DiskCache::Writeback);
    for _ in 0..cycles {
        let verdict = run.cycle();
        if !verdict.violations.is_empty() || !verdict.surprises.is_empty() {
            let kept = run.machine.keep();
            panic!(
                "[{name}] cycle {}: {} violations, {} of {} acknowledged appends lost \
                 (POWER_CUT_SEED={}; the machine's directory is kept at {kept}):\n\
                 {:#?}\nunexpected answers: {:#?}\n--- console of the boot after the cut ---\n{}",
                run.cycles,
                verdict.violations.len(),
                verdict.lost,
                verdict.acked,
                run.seed,
                verdict.violations,
                verdict.surprises,
                run.machine.console()
            );
        }
    }
    run.report("");
    assert_eq!(run.cycles, cycles, "[{name}] every cycle ran");
    assert!(
        run.acked_total() > 0,
        "[{name}] no append was acknowledged: the test proved nothing"
    );
}

fn run_control_case(test: &str, name: &str, flags: &[&str], cache: DiskCache) {
    let Some(kit) = Kit::find(test) else {
        return;
    };
    let mut run = Run::start(&kit, name, flags, cache);
    let mut lost = 0;
    while lost == 0 && run.cycles < CONTROL_CYCLES_MAX {
        let verdict = run.cycle();
        lost = verdict.lost;
        eprintln!(
            "power cut [{name}] control, cycle {}: {} of {} acknowledged appends lost, {} violations",
            run.cycles,
            verdict.lost,
            verdict.acked,
            verdict.violations.len()
        );
    }
    run.report(" (control)");
    assert!(
        lost > 0,
        "[{name}] the control lost nothing in {} cycles: the test cannot see a loss \
         (POWER_CUT_SEED={})",
        run.cycles,
        run.seed
    );
}

/// One case: its machine, the clients' state and history across cycles.
struct Run {
    name: String,
    machine: Machine,
    node: Node,
    seed: u64,
    schedule: XorShift,
    cycles: u32,
    plain: History,
    producer: History,
    state: ClientState,
    started: Instant,
    /// How long each boot took to `/ready`.
    boot_times: Vec<Duration>,
    answers: BTreeMap<u16, u64>,
}

/// What the clients carry from one cycle to the next.
#[derive(Clone, Default)]
struct ClientState {
    /// The next body number of each plain writer.
    plain_next: [u64; 2],
    /// The producer's sequence number not acknowledged yet.
    producer_seq: u64,
    /// Where each reader goes on: the plain stream's, the producer stream's.
    reader_next: [u64; 2],
}

/// What a check after a reboot found.
struct Verdict {
    violations: Vec<Violation>,
    /// Acknowledged appends so far (a producer's sequence number counts once).
    acked: usize,
    /// Of those, how many the streams do not hold.
    lost: usize,
    surprises: Vec<String>,
}

impl Run {
    fn start(kit: &Kit, name: &str, flags: &[&str], cache: DiskCache) -> Run {
        let seed = std::env::var("POWER_CUT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(XorShift::seed_from_time);
        let mut args: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        args.extend(SMALL_SEGMENTS.iter().map(|s| s.to_string()));
        args.extend(["--cores", "2", "--long-poll-timeout-sec", "1"].map(String::from));
        eprintln!("power cut [{name}]: pico serve {args:?}, disk {cache:?}, POWER_CUT_SEED={seed}");
        let mut machine = Machine::new(kit, name, &args, cache);
        let began = Instant::now();
        let node = machine.boot();
        let boot_time = began.elapsed();
        for stream in [PLAIN_STREAM, PRODUCER_STREAM] {
            let created = request(
                node.pico,
                "PUT",
                stream,
                &[("content-type", "application/octet-stream")],
                b"",
            );
            assert_eq!(
                created.as_ref().map(|r| r.status),
                Some(201),
                "PUT {stream}: {:?}\n{}",
                created.map(|r| r.describe()),
                machine.console()
            );
        }
        Run {
            name: name.to_string(),
            machine,
            node,
            seed,
            schedule: XorShift::new(seed),
            cycles: 0,
            plain: History::default(),
            producer: History::default(),
            state: ClientState::default(),
            started: Instant::now(),
            boot_times: vec![boot_time],
            answers: BTreeMap::new(),
        }
    }

    /// Writes and reads for a random time, cuts the power, boots again and checks the whole
    /// history so far against what the node serves now.
    fn cycle(&mut self) -> Verdict {
        self.cycles += 1;
        let write_ms = self.schedule.range(WRITE_MS.0, WRITE_MS.1);
        let clients = Clients::start(self.node, self.state.clone(), self.started);
        std::thread::sleep(Duration::from_millis(write_ms));
        self.machine.power_cut();
        let done = clients.stop();
        self.state = done.state;
        self.plain.appends.extend(done.plain.appends);
        self.plain.reads.extend(done.plain.reads);
        self.producer.appends.extend(done.producer.appends);
        self.producer.reads.extend(done.producer.reads);
        for (status, n) in done.answers {
            *self.answers.entry(status).or_default() += n;
        }
        let began = Instant::now();
        self.node = self.machine.boot();
        self.boot_times.push(began.elapsed());

        let mut violations = Vec::new();
        let (mut acked, mut lost) = (0, 0);
        for (stream, history) in [
            (PLAIN_STREAM, &self.plain),
            (PRODUCER_STREAM, &self.producer),
        ] {
            let last = read_stream(self.node.pico, stream).unwrap_or_else(|e| {
                panic!(
                    "[{}] cycle {}: {e}\n--- console ---\n{}",
                    self.name,
                    self.cycles,
                    self.machine.console()
                )
            });
            violations.extend(check(history, &last));
            let (a, l) = acked_and_lost(history, &last);
            acked += a;
            lost += l;
        }
        eprintln!(
            "power cut [{}] cycle {}: wrote {write_ms} ms, rebooted in {:.1} s; {acked} \
             acknowledged so far, {lost} lost, {} violations",
            self.name,
            self.cycles,
            self.boot_times.last().unwrap().as_secs_f64(),
            violations.len()
        );
        Verdict {
            violations,
            acked,
            lost,
            surprises: done.surprises,
        }
    }

    fn acked_total(&self) -> usize {
        acked_and_lost(&self.plain, &[]).0 + acked_and_lost(&self.producer, &[]).0
    }

    fn report(&self, kind: &str) {
        let boots: Vec<String> = self
            .boot_times
            .iter()
            .map(|d| format!("{:.0}", d.as_secs_f64()))
            .collect();
        let producer_acked = acked_and_lost(&self.producer, &[]).0;
        eprintln!(
            "power cut [{}]{kind}: {} cycles, {} appends acknowledged ({producer_acked} by the \
             producer) of {} sent, {} live reads; append answers {:?}; boots to /ready (s) {}",
            self.name,
            self.cycles,
            self.acked_total(),
            self.plain.appends.len() + self.producer.appends.len(),
            self.plain.reads.len() + self.producer.reads.len(),
            self.answers,
            boots.join(" ")
        );
    }
}

/// Acknowledged appends of `history` (one per body: a producer's retries acknowledged twice
/// count once), and how many of them `last` does not hold.
fn acked_and_lost(history: &History, last: &[(u64, Vec<u8>)]) -> (usize, usize) {
    let stored: HashSet<&[u8]> = last.iter().map(|(_, body)| body.as_slice()).collect();
    let acked: HashSet<&[u8]> = history
        .appends
        .iter()
        .filter(|a| a.outcome != Outcome::NotAcked)
        .map(|a| a.body.as_slice())
        .collect();
    let lost = acked.iter().filter(|body| !stored.contains(*body)).count();
    (acked.len(), lost)
}

/// The clients of one cycle: threads that run until [`Clients::stop`].
struct Clients {
    stop: Arc<AtomicBool>,
    plain: [std::thread::JoinHandle<(u64, History, Tally)>; 2],
    producer: std::thread::JoinHandle<(u64, History, Tally)>,
    readers: [std::thread::JoinHandle<(u64, History)>; 2],
}

/// What the clients of one cycle did.
struct Done {
    state: ClientState,
    plain: History,
    producer: History,
    answers: BTreeMap<u16, u64>,
    surprises: Vec<String>,
}

/// The answers one writer got: how often each status (0: none), and the ones no cut explains.
#[derive(Default)]
struct Tally {
    statuses: BTreeMap<u16, u64>,
    surprises: Vec<String>,
}

impl Tally {
    fn count(&mut self, client: &str, response: Option<&Resp>) {
        *self
            .statuses
            .entry(response.map_or(0, |r| r.status))
            .or_default() += 1;
        if let Some(r) = response {
            // 500: the round whose fdatasync failed as the disk went away; 503: appends after
            // it; 429: object durability's back-pressure.
            if !matches!(r.status, 200 | 429 | 500 | 503) && self.surprises.len() < 10 {
                self.surprises.push(format!("{client}: {}", r.describe()));
            }
        }
    }
}

impl Clients {
    fn start(node: Node, state: ClientState, started: Instant) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let plain = [0, 1].map(|id| {
            let (stop, next) = (stop.clone(), state.plain_next[id]);
            std::thread::spawn(move || plain_writer(node.pico, id, next, &stop, started))
        });
        let producer = {
            let (stop, seq) = (stop.clone(), state.producer_seq);
            std::thread::spawn(move || producer(node.pico, seq, &stop, started))
        };
        let readers = [PLAIN_STREAM, PRODUCER_STREAM].map(|stream| {
            let stop = stop.clone();
            let next = state.reader_next[usize::from(stream == PRODUCER_STREAM)];
            std::thread::spawn(move || reader(node.pico, stream, next, &stop, started))
        });
        Clients {
            stop,
            plain,
            producer,
            readers,
        }
    }

    /// Stops the clients (after the cut: their requests fail at once) and collects them.
    fn stop(self) -> Done {
        self.stop.store(true, Ordering::Relaxed);
        let mut state = ClientState::default();
        let mut plain = History::default();
        let mut producer = History::default();
        let mut answers = BTreeMap::new();
        let mut surprises = Vec::new();
        let mut tallied = |tally: Tally| {
            for (status, n) in tally.statuses {
                *answers.entry(status).or_default() += n;
            }
            surprises.extend(tally.surprises);
        };
        for (id, writer) in self.plain.into_iter().enumerate() {
            let (next, history, tally) = writer.join().expect("a plain writer");
            state.plain_next[id] = next;
            plain.appends.extend(history.appends);
            tallied(tally);
        }
        let (seq, history, tally) = self.producer.join().expect("the producer");
        state.producer_seq = seq;
        producer.appends.extend(history.appends);
        tallied(tally);
        for (i, reader) in self.readers.into_iter().enumerate() {
            let (next, history) = reader.join().expect("a reader");
            state.reader_next[i] = next;
            if i == 0 {
                plain.reads.extend(history.reads);
            } else {
                producer.reads.extend(history.reads);
            }
        }
        Done {
            state,
            plain,
            producer,
            answers,
            surprises,
        }
    }
}

/// A keep-alive connection that is made again after any failure.
struct Client {
    addr: SocketAddr,
    conn: Option<Conn>,
}

impl Client {
    fn new(addr: SocketAddr) -> Client {
        Client { addr, conn: None }
    }

    /// The answer, or `None` when the connection failed (the request's outcome is unknown).
    fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<Resp> {
        if self.conn.is_none() {
            match Conn::connect(self.addr) {
                Ok(mut conn) => {
                    conn.set_read_timeout(CLIENT_TIMEOUT);
                    self.conn = Some(conn);
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    return None;
                }
            }
        }
        let conn = self.conn.as_mut()?;
        match conn.request(method, target, headers, body) {
            Ok(response) => {
                if response.header("connection") == Some("close") {
                    self.conn = None;
                }
                Some(response)
            }
            Err(_) => {
                self.conn = None;
                None
            }
        }
    }
}

/// One request on a fresh connection; `None` when it failed.
fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<Resp> {
    Client::new(addr).request(method, target, headers, body)
}

fn ms_since(started: Instant) -> u64 {
    started.elapsed().as_millis() as u64
}

/// Appends a body of its own per request (never resent) until stopped; the next number.
fn plain_writer(
    addr: SocketAddr,
    id: usize,
    mut next: u64,
    stop: &AtomicBool,
    started: Instant,
) -> (u64, History, Tally) {
    let name = format!("plain-{id}");
    let mut client = Client::new(addr);
    let mut history = History::default();
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let body = format!("{name}-{next}-{}", "x".repeat(PAD));
        next += 1;
        let invoked_ms = ms_since(started);
        let response = client.request("POST", PLAIN_STREAM, &[], body.as_bytes());
        tally.count(&name, response.as_ref());
        let outcome = match &response {
            Some(r) if r.status == 200 => Outcome::Acked {
                offset: Some(r.h_u64("pico-start-seq")),
            },
            _ => Outcome::NotAcked,
        };
        let acked = outcome != Outcome::NotAcked;
        history.appends.push(Append {
            client: name.clone(),
            body: body.into_bytes(),
            invoked_ms,
            completed_ms: ms_since(started),
            outcome,
        });
        if !acked {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (next, history, tally)
}

/// An idempotent producer: resends its sequence number, with the same body, until it is
/// acknowledged, across cuts; the sequence number not acknowledged yet.
fn producer(
    addr: SocketAddr,
    mut seq: u64,
    stop: &AtomicBool,
    started: Instant,
) -> (u64, History, Tally) {
    let mut client = Client::new(addr);
    let mut history = History::default();
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let body = format!("producer-{seq}-{}", "x".repeat(PAD));
        let seq_text = seq.to_string();
        let headers = [
            ("pico-producer-id", PRODUCER_ID),
            ("pico-producer-epoch", "0"),
            ("pico-producer-seq", seq_text.as_str()),
        ];
        let invoked_ms = ms_since(started);
        let response = client.request("POST", PRODUCER_STREAM, &headers, body.as_bytes());
        tally.count("producer", response.as_ref());
        // A duplicate (the sequence number was stored before, its answer lost in a cut) is
        // `200` without `Pico-Start-Seq`.
        let outcome = match &response {
            Some(r) if r.status == 200 => Outcome::Acked {
                offset: r.header("pico-start-seq").and_then(|s| s.parse().ok()),
            },
            _ => Outcome::NotAcked,
        };
        let acked = outcome != Outcome::NotAcked;
        history.appends.push(Append {
            client: "producer".into(),
            body: body.into_bytes(),
            invoked_ms,
            completed_ms: ms_since(started),
            outcome,
        });
        if acked {
            seq += 1;
        } else if response.as_ref().is_some_and(|r| r.status == 409) {
            // The node and the producer disagree on the sequence (kept as a surprise above):
            // resending would only repeat it.
            break;
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (seq, history, tally)
}

/// Tails a stream with long-polls from `next` until stopped; where it got to.
fn reader(
    addr: SocketAddr,
    stream: &'static str,
    mut next: u64,
    stop: &AtomicBool,
    started: Instant,
) -> (u64, History) {
    let name = format!("reader {stream}");
    let mut client = Client::new(addr);
    let mut history = History::default();
    while !stop.load(Ordering::Relaxed) {
        let target = format!("{stream}?seq={next}&format=binary&live=long-poll");
        let invoked_ms = ms_since(started);
        let Some(response) = client.request("GET", &target, &[], b"") else {
            continue;
        };
        if response.status != 200 {
            // 204: the long-poll timed out with nothing new.
            if response.status != 204 {
                std::thread::sleep(Duration::from_millis(20));
            }
            continue;
        }
        let records: Vec<(u64, Vec<u8>)> = decode_binary_read(&response.body)
            .into_iter()
            .map(|r| (r.seq, r.body))
            .collect();
        let from = next;
        next = response.h_u64("pico-next-seq").max(next);
        history.reads.push(Read {
            reader: name.clone(),
            from,
            records,
            invoked_ms,
            completed_ms: ms_since(started),
        });
    }
    (next, history)
}

/// A whole stream as the node serves it now, read in binary pages; empty when the stream is
/// gone (`404`: a disk that lost everything), an error when it cannot be read.
fn read_stream(addr: SocketAddr, stream: &str) -> Result<Vec<(u64, Vec<u8>)>, String> {
    let mut client = Client::new(addr);
    let mut records = Vec::new();
    let mut next = 0u64;
    let deadline = Instant::now() + READ_BOUND;
    let mut last = String::from("no answer");
    loop {
        if Instant::now() > deadline {
            return Err(format!("reading {stream} at {next} did not finish: {last}"));
        }
        let target = format!("{stream}?seq={next}&format=binary&bytes=1048576");
        let response = match client.request("GET", &target, &[], b"") {
            Some(r) if r.status == 200 => r,
            Some(r) if r.status == 404 && next == 0 => return Ok(Vec::new()),
            Some(r) if r.status == 503 => {
                last = r.describe();
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Some(r) => return Err(format!("GET {target}: {}", r.describe())),
            None => {
                last = "no answer".into();
                continue;
            }
        };
        let page = decode_binary_read(&response.body);
        if let Some(first) = page.first() {
            if first.seq != next {
                return Err(format!("a page of {stream} from {next} starts at {}", first.seq));
            }
        }
        let page_next = response.h_u64("pico-next-seq");
        if page_next != next + page.len() as u64 {
            return Err(format!(
                "a page of {stream} from {next} with {} records says next {page_next}",
                page.len()
            ));
        }
        next = page_next;
        let empty = page.is_empty();
        records.extend(page.into_iter().map(|r| (r.seq, r.body)));
        if response.header("pico-up-to-date") == Some("true") {
            return Ok(records);
        }
        if empty {
            return Err(format!("an empty page of {stream} at {next} that is not up to date"));
        }
    }
}
