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
//! Three streams, each tailed by a long-poll reader: four plain Pico writers on the first; an
//! idempotent producer (`Pico-Producer-*` headers, resending a sequence number with the same
//! body until it gets a `2xx`, across cuts) on the second; a plain writer on the third, whose
//! retention keeps 4 KiB, so that its oldest records are trimmed away every second and the
//! garbage collector deletes their segments (`--gc-interval-ms 500`). Segments are small and
//! young (`--segment-size 65536 --segment-max-age-ms 200`), so a cut often lands in a seal, an
//! object write and its rename, a catalog commit, a trim or a delete. On the retained stream
//! the rules hold from its start after the reboot: what retention took is not a loss, but a
//! trim that a cut takes back must bring back every record it had trimmed, intact. A lifecycle
//! client creates names of its own, appends to them, closes, deletes, creates again, trims and
//! forks them, one operation at a time; after each reboot every name so far must be in a state its
//! acknowledged operations lead to (`pico_testkit::lifecycle`), and in the same state as after
//! the first reboot that followed them. A consumer client follows the first stream as a named
//! consumer: it reads a page, acknowledges its last record, acquires the consumer again every
//! few rounds and sends one ack with the token it held before, which must be refused; after
//! each reboot the consumer must hold every acknowledged acquire and ack, nothing never sent,
//! what it served before, and no offset past the stream (`pico_testkit::consumer`). Every third
//! cycle, the boot after the cut is cut too, 0-2.5 s after `pico serve` started: in its
//! recovery (WAL replay, uploads of sealed segments, catalog commits) or just after it.
//!
//! Cases: `--durability local` (the single node's default) and `--durability object` on
//! `file://`, each for `POWER_CUT_CYCLES` cycles (default 3; the long run is
//! `POWER_CUT_CYCLES=200`). Two controls must see a loss, or the test fails: a disk that
//! ignores flushes (which must lose acknowledged lifecycle operations too), and `--durability
//! memory` (acknowledged before any `fdatasync`); the first must also lose what the consumer
//! client was told. Each
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

use common::{decode_binary_read, history_read, Conn, Resp, XorShift};
use pico_testkit::consumer::{self, Driver};
use pico_testkit::history::{check, Append, History, Outcome, Read, Violation};
use pico_testkit::lifecycle::{self, Protocol, State, Step, World};
use vm::{DiskCache, Kit, Machine, Node};

/// The streams: (name, `Pico-Retention-Bytes` at create).
const STREAMS: [(&str, Option<u64>); 3] = [
    ("/power/plain", None),
    ("/power/producer", None),
    ("/power/retained", Some(RETAINED_BYTES)),
];
/// What the retained stream keeps: about ten records, so that each retention round (one a
/// second) trims it.
const RETAINED_BYTES: u64 = 4 * 1024;

/// What a client does, and on which stream (an index into [`STREAMS`]).
#[derive(Clone, Copy, Debug)]
enum Role {
    /// Appends a body of its own per request, never resent.
    Writer(usize),
    /// An idempotent producer: resends a sequence number with the same body until a `2xx`.
    Producer(usize),
    /// Tails the stream with long-polls.
    Reader(usize),
    /// Creates, appends to, closes, deletes, creates again and trims names of its own
    /// and forks them (`/power/life-<n>`, `pico_testkit::lifecycle::plan`), one operation at a
    /// time.
    Lifecycle,
    /// Follows the stream as the named consumer [`CONSUMER`]: reads a page, acknowledges its
    /// last record, acquires the consumer again every few rounds and probes the fencing with
    /// the token it held before (`pico_testkit::consumer::Driver`).
    Consumer(usize),
}

impl Role {
    /// The client's name in the history: its role and its index in [`CLIENTS`].
    fn name(self, id: usize) -> String {
        let role = match self {
            Role::Writer(_) => "writer",
            Role::Producer(_) => "producer",
            Role::Reader(_) => "reader",
            Role::Lifecycle => "lifecycle",
            Role::Consumer(_) => "consumer",
        };
        format!("{role}-{id}")
    }
}

const CLIENTS: [Role; 11] = [
    Role::Writer(0),
    Role::Writer(0),
    Role::Writer(0),
    Role::Writer(0),
    Role::Producer(1),
    Role::Writer(2),
    Role::Reader(0),
    Role::Reader(1),
    Role::Reader(2),
    Role::Lifecycle,
    Role::Consumer(0),
];

/// The named consumer of the first stream, and its holder's lease: longer than a reboot, so
/// that the token held before a cut still holds the consumer after it.
const CONSUMER: &str = "/power/consumer";
const CONSUMER_LEASE_MS: u64 = 120_000;

/// The lifecycle client's pause between two plans, so that the names checked after each
/// reboot (every name so far, each a `HEAD` and a read) stay a few hundred.
const LIFE_PAUSE: Duration = Duration::from_millis(25);

/// One plan of the lifecycle client: its steps, and what the node served for its names after
/// the first reboot that followed them (a later reboot must serve the same).
struct Life {
    steps: Vec<Step>,
    found: Option<(u32, World)>,
}

const PRODUCER_ID: &str = "power-cut";
/// Bytes of padding per record: about 150 records fill a 64 KiB segment.
const PAD: usize = 400;
/// How long the clients write before a cut: a random time in this range (ms).
const WRITE_MS: (u64, u64) = (1000, 4000);
/// A cut while the node starts (every third cycle) comes this long (at most, ms) after its
/// init started `pico serve`: in its recovery, or just after.
const START_CUT_MS: u64 = 2500;
/// Cycles of each durable case unless `POWER_CUT_CYCLES` says.
const CYCLES_DEFAULT: u32 = 3;
/// The longest the last cycle writes on for a trim of the retained stream to be seen.
const TRIM_WAIT: Duration = Duration::from_secs(90);
/// A control that has seen no loss after this many cycles fails.
const CONTROL_CYCLES_MAX: u32 = 3;
/// A client waits this long for an answer (a request in flight at a cut fails at once: qemu's
/// end of the forwarded connection goes with it).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a full read of a stream after a reboot may take.
const READ_BOUND: Duration = Duration::from_secs(120);

/// Every case's node: small segments sealed young, the garbage collector every 500 ms, short
/// long-polls.
const NODE_FLAGS: [&str; 10] = [
    "--segment-size",
    "65536",
    "--segment-max-age-ms",
    "200",
    "--gc-interval-ms",
    "500",
    "--cores",
    "2",
    "--long-poll-timeout-sec",
    "1",
];

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
    for cycle in 1..=cycles {
        // A machine too busy to write the retained stream past its retention in the planned
        // cycles writes on in the last one until it sees a trim.
        let until_trimmed = cycle == cycles && !run.trim_seen;
        let verdict = run.cycle(until_trimmed);
        if !verdict.violations.is_empty() || !verdict.surprises.is_empty() {
            // The console is read before the directory is kept (and no longer the machine's).
            let console = run.machine.console();
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
                console
            );
        }
    }
    run.report("");
    assert_eq!(run.cycles, cycles, "[{name}] every cycle ran");
    if cycles > 0 {
        assert!(
            run.trim_seen,
            "[{name}] retention never trimmed {} (not within {} s of writing either): the \
             cuts could not land in a trim",
            STREAMS[2].0,
            TRIM_WAIT.as_secs()
        );
    }
    for (i, (stream, _)) in STREAMS.iter().enumerate() {
        assert!(
            acked_and_lost(&run.histories[i], &[]).0 > 0,
            "[{name}] no append to {stream} was acknowledged: the test proved nothing"
        );
    }
}

fn run_control_case(test: &str, name: &str, flags: &[&str], cache: DiskCache) {
    let Some(kit) = Kit::find(test) else {
        return;
    };
    let mut run = Run::start(&kit, name, flags, cache);
    // A loss the checker reports: an acknowledged append missing (rule 1). A disk that ignores
    // flushes also loses what the lifecycle client was told was done (rule 7): the creates,
    // closes and deletes of the catalog; and what the consumer client was (rule 8).
    let catalog_loss_expected = cache == DiskCache::IgnoresFlushes;
    let mut seen = None;
    let mut lifecycle_loss = None;
    let mut consumer_loss = None;
    while (seen.is_none()
        || (catalog_loss_expected && (lifecycle_loss.is_none() || consumer_loss.is_none())))
        && run.cycles < CONTROL_CYCLES_MAX
    {
        let verdict = run.cycle(false);
        let example = |rule: u8| {
            verdict
                .violations
                .iter()
                .find(|v| v.rule == rule)
                .map(|v| v.message[..v.message.len().min(160)].to_string())
        };
        lifecycle_loss = lifecycle_loss.or_else(|| example(7));
        consumer_loss = consumer_loss.or_else(|| example(8));
        eprintln!(
            "power cut [{name}] control, cycle {}: {} of {} acknowledged appends lost, {} violations",
            run.cycles,
            verdict.lost,
            verdict.acked,
            verdict.violations.len()
        );
        if seen.is_none() && verdict.lost > 0 && verdict.violations.iter().any(|v| v.rule == 1) {
            seen = Some(verdict);
        }
    }
    run.report(" (control)");
    if catalog_loss_expected {
        let Some(example) = lifecycle_loss else {
            panic!(
                "[{name}] the control lost no create, close or delete in {} cycles: the test \
                 cannot see such a loss (POWER_CUT_SEED={})",
                run.cycles, run.seed
            );
        };
        eprintln!("power cut [{name}] control: the lifecycle check saw the loss, e.g. {example}");
        let Some(example) = consumer_loss else {
            panic!(
                "[{name}] the control lost no consumer registration, acquire or ack in {} \
                 cycles: the test cannot see such a loss (POWER_CUT_SEED={})",
                run.cycles, run.seed
            );
        };
        eprintln!("power cut [{name}] control: the consumer check saw the loss, e.g. {example}");
    }
    let Some(verdict) = seen else {
        panic!(
            "[{name}] the control lost nothing in {} cycles: the test cannot see a loss \
             (POWER_CUT_SEED={})",
            run.cycles, run.seed
        );
    };
    eprintln!(
        "power cut [{name}] control: the checker saw the loss, e.g. {:?}",
        verdict
            .violations
            .iter()
            .find(|v| v.rule == 1)
            .map(|v| &v.message[..v.message.len().min(120)])
    );
}

/// One case: its machine, the clients' state and the history of every stream across cycles.
struct Run {
    name: String,
    machine: Machine,
    node: Node,
    seed: u64,
    schedule: XorShift,
    cycles: u32,
    /// One per stream of [`STREAMS`].
    histories: Vec<History>,
    /// Per client of [`CLIENTS`]: a writer's next body number, the producer's sequence
    /// number not acknowledged yet, a reader's next offset.
    positions: Vec<u64>,
    started: Instant,
    /// How long each boot took to `/ready`.
    boot_times: Vec<Duration>,
    answers: BTreeMap<u16, u64>,
    /// Where each stream started after the latest reboot (above 0: trimmed).
    starts: Vec<u64>,
    /// Retention trimmed the retained stream at least once (seen after a reboot, or while
    /// writing).
    trim_seen: bool,
    /// Every name the lifecycle client worked on, across cycles.
    lives: Vec<Life>,
    /// The consumer client's driver, with every step it took across cycles (in the client's
    /// thread while a cycle runs).
    consumer: Option<Driver>,
}

/// What a check after a reboot found, over every stream.
struct Verdict {
    violations: Vec<Violation>,
    /// Acknowledged appends so far (a producer's sequence number counts once; what retention
    /// trimmed away does not count).
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
        args.extend(NODE_FLAGS.iter().map(|s| s.to_string()));
        eprintln!("power cut [{name}]: pico serve {args:?}, disk {cache:?}, POWER_CUT_SEED={seed}");
        let mut machine = Machine::new(kit, name, &args, cache);
        let began = Instant::now();
        let node = machine.boot();
        let boot_time = began.elapsed();
        for (stream, retained) in STREAMS {
            let bytes = retained.map(|b| b.to_string());
            let mut headers = vec![("content-type", "application/octet-stream")];
            if let Some(bytes) = &bytes {
                headers.push(("pico-retention-bytes", bytes));
            }
            let created = Client::new(node.pico).request("PUT", stream, &headers, b"");
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
            histories: vec![History::default(); STREAMS.len()],
            positions: vec![0; CLIENTS.len()],
            started: Instant::now(),
            boot_times: vec![boot_time],
            answers: BTreeMap::new(),
            starts: vec![0; STREAMS.len()],
            trim_seen: false,
            lives: Vec::new(),
            consumer: Some(Driver::new(CONSUMER, STREAMS[0].0, CONSUMER_LEASE_MS)),
        }
    }

    /// Writes and reads for a random time, cuts the power, boots again and checks the whole
    /// history so far against what the node serves now.
    /// One cycle: the clients write for a random time (and, with `until_trimmed`, on until
    /// the retained stream was trimmed, at most [`TRIM_WAIT`]), the power is cut, the machine
    /// boots again and everything is checked.
    fn cycle(&mut self, until_trimmed: bool) -> Verdict {
        self.cycles += 1;
        let write_ms = self.schedule.range(WRITE_MS.0, WRITE_MS.1);
        let cycle_began_ms = self.started.elapsed().as_millis() as u64;
        let stop = Arc::new(AtomicBool::new(false));
        let mut driver = self.consumer.take();
        let clients: Vec<_> = CLIENTS
            .iter()
            .zip(&self.positions)
            .enumerate()
            .map(|(id, (&role, &position))| {
                let (stop, addr, started) = (stop.clone(), self.node.pico, self.started);
                let ds = self.node.ds;
                let mut driver = matches!(role, Role::Consumer(_))
                    .then(|| driver.take())
                    .flatten();
                std::thread::spawn(move || {
                    let mut client = ClientRun {
                        client: Client::new(addr),
                        name: role.name(id),
                        stop,
                        started,
                        history: History::default(),
                        tally: Tally::default(),
                        lives: Vec::new(),
                    };
                    let position = match role {
                        Role::Writer(stream) => client.writer(STREAMS[stream].0, position),
                        Role::Producer(stream) => client.producer(STREAMS[stream].0, position),
                        Role::Reader(stream) => client.reader(STREAMS[stream].0, position),
                        Role::Lifecycle => client.lifecycle(ds, position),
                        Role::Consumer(stream) => client.consumer(
                            STREAMS[stream].0,
                            position,
                            driver.as_mut().expect("the consumer's driver"),
                        ),
                    };
                    (position, client.history, client.tally, client.lives, driver)
                })
            })
            .collect();
        let writing = Instant::now();
        std::thread::sleep(Duration::from_millis(write_ms));
        if until_trimmed {
            let deadline = Instant::now() + TRIM_WAIT;
            while Instant::now() < deadline {
                if first_offset(self.node.pico, STREAMS[2].0).is_some_and(|start| start > 0) {
                    self.trim_seen = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        let write_ms = writing.elapsed().as_millis();
        self.machine.power_cut();
        // The clients' requests fail at once now; they stop at the next.
        stop.store(true, Ordering::Relaxed);
        let mut surprises = Vec::new();
        let mut answers = BTreeMap::<u16, u64>::new();
        // When the first append of the cycle was acknowledged, from the clients' start.
        let mut first_ack_ms = None::<u64>;
        for (id, client) in clients.into_iter().enumerate() {
            let (position, history, tally, lives, driver) = client.join().expect("a client thread");
            self.positions[id] = position;
            if driver.is_some() {
                self.consumer = driver;
            }
            for steps in lives {
                self.lives.push(Life { steps, found: None });
            }
            for (status, n) in tally.statuses {
                *answers.entry(status).or_default() += n;
                *self.answers.entry(status).or_default() += n;
            }
            surprises.extend(tally.surprises);
            let stream = match CLIENTS[id] {
                Role::Writer(s) | Role::Producer(s) | Role::Reader(s) | Role::Consumer(s) => s,
                Role::Lifecycle => continue,
            };
            let first = history
                .appends
                .iter()
                .filter(|a| a.outcome != Outcome::NotAcked)
                .map(|a| a.completed_ms - cycle_began_ms)
                .min();
            if let Some(first) = first {
                first_ack_ms = Some(first_ack_ms.map_or(first, |f| f.min(first)));
            }
            self.histories[stream].appends.extend(history.appends);
            self.histories[stream].reads.extend(history.reads);
        }

        // Every third cycle the next boot is cut too, while the node recovers and starts.
        let start_cut = (self.cycles % 3 == 2).then(|| {
            let after = self.schedule.range(0, START_CUT_MS);
            let serving = self
                .machine
                .cut_while_starting(Duration::from_millis(after));
            let when = if serving { "serving" } else { "starting" };
            format!("cut again {after} ms into the next start (the node was {when}), ")
        });
        let began = Instant::now();
        self.node = self.machine.boot();
        self.boot_times.push(began.elapsed());
        let mut violations = Vec::new();
        let (mut acked, mut lost) = (0, 0);
        // Each stream's next offset as read now.
        let mut tails = vec![0; STREAMS.len()];
        for (i, (stream, retained)) in STREAMS.iter().enumerate() {
            let last = read_stream(self.node.pico, stream).unwrap_or_else(|e| {
                panic!(
                    "[{}] cycle {}: {e}\n--- console ---\n{}",
                    self.name,
                    self.cycles,
                    self.machine.console()
                )
            });
            self.starts[i] = last.first().map_or(0, |&(start, _)| start);
            self.trim_seen |= STREAMS[i].1.is_some() && self.starts[i] > 0;
            tails[i] = last.last().map_or(self.starts[i], |&(seq, _)| seq + 1);
            let history = match (retained, last.first()) {
                // What retention took is not a loss: the rules hold from the start.
                (Some(_), Some(&(start, _))) => from_start(&self.histories[i], start),
                _ => self.histories[i].clone(),
            };
            violations.extend(check(&history, &last).into_iter().map(|mut v| {
                v.message = format!("{stream}: {}", v.message);
                v
            }));
            let (a, l) = acked_and_lost(&history, &last);
            acked += a;
            lost += l;
        }
        let lives = self.check_lives();
        let (lives_checked, lives_violations) = (self.lives.len(), lives.len());
        violations.extend(lives);
        let (consumer_found, consumer_violations) = self.check_consumer(tails[0]);
        violations.extend(consumer_violations);
        eprintln!(
            "power cut [{}] cycle {}: wrote {write_ms} ms (answers {answers:?}, the \
             first append acknowledged after {} ms), \
             {}rebooted in {:.1} s; {acked} acknowledged so far, {lost} lost, {} violations \
             ({lives_violations} of them in the {lives_checked} plans of the lifecycle client); \
             streams start at {:?}; the consumer: {consumer_found}",
            self.name,
            self.cycles,
            first_ack_ms.map_or("-".to_string(), |ms| ms.to_string()),
            start_cut.unwrap_or_default(),
            self.boot_times.last().unwrap().as_secs_f64(),
            violations.len(),
            self.starts
        );
        Verdict {
            violations,
            acked,
            lost,
            surprises,
        }
    }

    /// Holds the consumer client's steps so far against what the node serves for its consumer
    /// now and the stream's next offset `tail`, then keeps what it served (it must stay):
    /// what was found, for the report, and the violations.
    fn check_consumer(&mut self, tail: u64) -> (String, Vec<Violation>) {
        let driver = self
            .consumer
            .as_mut()
            .expect("the consumer's driver is back");
        let mut client = Client::new(self.node.pico);
        let deadline = Instant::now() + READ_BOUND;
        let reply = loop {
            let reply = client.request("GET", &driver.target(), &[], b"");
            match &reply {
                Some(r) if r.status != 503 => break reply,
                _ if Instant::now() > deadline => break reply,
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let reply = reply.map(Into::into);
        let found = driver.found(reply).unwrap_or_else(|e| {
            panic!(
                "[{}] cycle {}: {e}\n--- console ---\n{}",
                self.name,
                self.cycles,
                self.machine.console()
            )
        });
        let violations = consumer::check(&driver.steps, found, tail)
            .into_iter()
            .map(|message| Violation {
                rule: 8,
                message: format!("{CONSUMER}: {message}"),
            })
            .collect();
        let acks = driver
            .steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    consumer::Step::Ack {
                        told: consumer::Told::Done,
                        ..
                    }
                )
            })
            .count();
        let report = match found {
            Some(found) => {
                driver.steps.push(consumer::Step::Seen(found));
                format!(
                    "epoch {}, offset {} ({acks} acks acknowledged so far)",
                    found.epoch, found.offset
                )
            }
            None => "absent".to_string(),
        };
        (report, violations)
    }

    /// Holds every plan of the lifecycle client against what the node serves now: a world
    /// its steps allow, and the one it served after the first reboot that followed them.
    fn check_lives(&mut self) -> Vec<Violation> {
        let mut violations = Vec::new();
        for life in &mut self.lives {
            let found = observe_all(self.node.pico, &life.steps).unwrap_or_else(|e| {
                panic!(
                    "[{}] cycle {}: {e}\n--- console ---\n{}",
                    self.name,
                    self.cycles,
                    self.machine.console()
                )
            });
            let message = match &life.found {
                Some((cycle, first)) if *first != found => Some(format!(
                    "served {} after cycle {cycle}, {} after cycle {}",
                    lifecycle::describe(first),
                    lifecycle::describe(&found),
                    self.cycles
                )),
                Some(_) => None,
                None => lifecycle::check(&life.steps, &found),
            };
            if let Some(message) = message {
                violations.push(Violation { rule: 7, message });
            }
            life.found.get_or_insert((self.cycles, found));
        }
        violations
    }

    fn report(&self, kind: &str) {
        let boots: Vec<String> = self
            .boot_times
            .iter()
            .map(|d| format!("{:.0}", d.as_secs_f64()))
            .collect();
        let acked: Vec<String> = STREAMS
            .iter()
            .zip(&self.histories)
            .map(|((stream, _), h)| format!("{stream} {}", acked_and_lost(h, &[]).0))
            .collect();
        // Resends of a sequence number stored before the cut that took its answer.
        let duplicates = self.histories[1]
            .appends
            .iter()
            .filter(|a| a.outcome == Outcome::Acked { offset: None })
            .count();
        eprintln!(
            "power cut [{}]{kind}: {} cycles in {:.0} s; appends acknowledged: {} (of {} sent; \
             {duplicates} producer resends answered as duplicates); {} live reads; append \
             answers {:?}; boots to /ready (s): {}",
            self.name,
            self.cycles,
            self.started.elapsed().as_secs_f64(),
            acked.join(", "),
            self.histories
                .iter()
                .map(|h| h.appends.len())
                .sum::<usize>(),
            self.histories.iter().map(|h| h.reads.len()).sum::<usize>(),
            self.answers,
            boots.join(" ")
        );
    }
}

/// `history` without what a stream starting at `start` no longer holds: appends acknowledged
/// below it, and the records readers were served below it.
fn from_start(history: &History, start: u64) -> History {
    let appends = history
        .appends
        .iter()
        .filter(|a| !matches!(a.outcome, Outcome::Acked { offset: Some(o) } if o < start))
        .cloned()
        .collect();
    let reads = history
        .reads
        .iter()
        .map(|r| Read {
            from: r.from.max(start),
            records: r
                .records
                .iter()
                .filter(|(o, _)| *o >= start)
                .cloned()
                .collect(),
            ..r.clone()
        })
        .collect();
    History { appends, reads }
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

/// The answers one client got to its appends: how often each status (0: none), and the ones
/// no cut explains.
#[derive(Default)]
struct Tally {
    statuses: BTreeMap<u16, u64>,
    surprises: Vec<String>,
}

impl Tally {
    /// Counts an answer; one neither `expected` nor explained by a cut is a surprise.
    fn count(&mut self, client: &str, response: Option<&Resp>, expected: &[u16]) {
        *self
            .statuses
            .entry(response.map_or(0, |r| r.status))
            .or_default() += 1;
        if let Some(r) = response {
            // 500: the round whose fdatasync failed as the disk went away; 503: appends after
            // it; 429: back-pressure.
            let explained = expected.contains(&r.status) || matches!(r.status, 429 | 500 | 503);
            if !explained && self.surprises.len() < 10 {
                self.surprises.push(format!("{client}: {}", r.describe()));
            }
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

/// One client thread of one cycle: what it did, until `stop`.
struct ClientRun {
    client: Client,
    name: String,
    stop: Arc<AtomicBool>,
    started: Instant,
    history: History,
    tally: Tally,
    /// The steps of each of the lifecycle client's plans.
    lives: Vec<Vec<Step>>,
}

impl ClientRun {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn record(&mut self, body: String, invoked_ms: u64, outcome: Outcome) {
        self.history.appends.push(Append {
            client: self.name.clone(),
            body: body.into_bytes(),
            invoked_ms,
            completed_ms: self.now_ms(),
            outcome,
        });
    }

    /// Appends a body of its own per request, numbered from `next`; the next number.
    fn writer(&mut self, stream: &str, mut next: u64) -> u64 {
        while !self.stopped() {
            let body = format!("{}-{next}-{}", self.name, "x".repeat(PAD));
            next += 1;
            let invoked_ms = self.now_ms();
            let response = self.client.request("POST", stream, &[], body.as_bytes());
            self.tally.count(&self.name, response.as_ref(), &[200]);
            let outcome = match &response {
                Some(r) if r.status == 200 => Outcome::Acked {
                    offset: Some(r.h_u64("pico-start-seq")),
                },
                _ => Outcome::NotAcked,
            };
            let acked = outcome != Outcome::NotAcked;
            self.record(body, invoked_ms, outcome);
            if !acked {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        next
    }

    /// An idempotent producer from sequence number `seq`, which it resends with the same body
    /// until it is acknowledged (in a later cycle too); the sequence number not acknowledged
    /// yet.
    fn producer(&mut self, stream: &str, mut seq: u64) -> u64 {
        while !self.stopped() {
            let body = format!("producer-{seq}-{}", "x".repeat(PAD));
            let seq_text = seq.to_string();
            let headers = [
                ("pico-producer-id", PRODUCER_ID),
                ("pico-producer-epoch", "0"),
                ("pico-producer-seq", seq_text.as_str()),
            ];
            let invoked_ms = self.now_ms();
            let response = self
                .client
                .request("POST", stream, &headers, body.as_bytes());
            self.tally.count(&self.name, response.as_ref(), &[200]);
            // A duplicate (the sequence number was stored before, its answer lost in a cut)
            // is `200` without `Pico-Start-Seq`.
            let outcome = match &response {
                Some(r) if r.status == 200 => Outcome::Acked {
                    offset: r.header("pico-start-seq").and_then(|s| s.parse().ok()),
                },
                _ => Outcome::NotAcked,
            };
            let acked = outcome != Outcome::NotAcked;
            self.record(body, invoked_ms, outcome);
            if acked {
                seq += 1;
            } else if response.as_ref().is_some_and(|r| r.status == 409) {
                // The node and the producer disagree on the sequence (a surprise, counted):
                // resending would only repeat it.
                break;
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        seq
    }

    /// Works through `lifecycle::plan`'s plans from the `n`th, each over its protocol's
    /// connection (`ds`: the node's Durable Streams listener); the next plan's number.
    fn lifecycle(&mut self, ds: SocketAddr, mut n: u64) -> u64 {
        let mut ds = Client::new(ds);
        while !self.stopped() {
            let steps = lifecycle::work_through(
                "/power/life-",
                n,
                true,
                |protocol, planned, method, headers, body| {
                    let client = match protocol {
                        Protocol::Pico => &mut self.client,
                        Protocol::DurableStreams => &mut ds,
                    };
                    let response = client.request(method, &planned.name, headers, body);
                    self.tally
                        .count(&self.name, response.as_ref(), planned.expected);
                    response.map(|r| lifecycle::Answer {
                        status: r.status,
                        headers: r.headers,
                    })
                },
            );
            self.lives.push(steps);
            n += 1;
            std::thread::sleep(LIFE_PAUSE);
        }
        n
    }

    /// Reads the stream from `next` a page at a time and, after each page, takes one round of
    /// the consumer `driver` (acknowledging the page's last record); where it got to.
    fn consumer(&mut self, stream: &str, mut next: u64, driver: &mut Driver) -> u64 {
        while !self.stopped() {
            let target = format!("{stream}?seq={next}&format=binary&bytes=65536");
            let invoked_ms = self.now_ms();
            if let Some(response) = self.client.request("GET", &target, &[], b"") {
                if response.status == 200 {
                    let completed_ms = self.now_ms();
                    let read;
                    (read, next) =
                        history_read(&self.name, next, &response, invoked_ms, completed_ms);
                    self.history.reads.push(read);
                }
            }
            let processed = next as i64 - 1;
            let (client, tally, name) = (&mut self.client, &mut self.tally, &self.name);
            driver.round(processed, |method, target, headers, body| {
                let response = client.request(method, target, headers, body);
                // 409: the fencing probe's stale token, refused as it must be.
                tally.count(name, response.as_ref(), &[200, 201, 409]);
                response.map(Into::into)
            });
            std::thread::sleep(Duration::from_millis(20));
        }
        next
    }

    /// Tails the stream with long-polls from `next`; where it got to. Below a trimmed
    /// stream's start (`410`) it goes on from the start.
    fn reader(&mut self, stream: &str, mut next: u64) -> u64 {
        while !self.stopped() {
            let target = format!("{stream}?seq={next}&format=binary&live=long-poll");
            let invoked_ms = self.now_ms();
            let Some(response) = self.client.request("GET", &target, &[], b"") else {
                continue;
            };
            match response.status {
                200 => {}
                // The long-poll timed out with nothing new.
                204 => continue,
                410 => {
                    let start = response.json()["next_seq"].as_u64();
                    next = start.expect("a 410 names the start").max(next);
                    continue;
                }
                _ => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            }
            let completed_ms = self.now_ms();
            let read;
            (read, next) = history_read(&self.name, next, &response, invoked_ms, completed_ms);
            self.history.reads.push(read);
        }
        next
    }
}

/// The names `steps` work on, as the node serves them now.
fn observe_all(addr: SocketAddr, steps: &[Step]) -> Result<World, String> {
    lifecycle::names(steps)
        .into_iter()
        .map(|name| Ok((name.clone(), observe(addr, &name)?)))
        .collect()
}

/// A name as the node serves it now: absent (`404`), or open or closed with its start, its
/// next offset and its records.
fn observe(addr: SocketAddr, name: &str) -> Result<State, String> {
    let mut client = Client::new(addr);
    let deadline = Instant::now() + READ_BOUND;
    let head = loop {
        if Instant::now() > deadline {
            return Err(format!("HEAD {name} did not answer"));
        }
        match client.request("HEAD", name, &[], b"") {
            Some(r) if r.status == 503 => std::thread::sleep(Duration::from_millis(100)),
            Some(r) => break r,
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    match head.status {
        404 => return Ok(State::Absent),
        410 => return Ok(State::Gone),
        200 => {}
        _ => return Err(format!("HEAD {name}: {}", head.describe())),
    }
    let records = read_stream(addr, name)?;
    Ok(State::Present {
        closed: head.header("pico-closed") == Some("true"),
        start: head.h_u64("pico-start-seq"),
        next: head.h_u64("pico-next-seq"),
        records,
    })
}

/// A whole stream as the node serves it now, from its start, read in binary pages; empty when
/// the stream is gone (`404`: a disk that lost everything), an error when it cannot be read.
/// The offset of `stream`'s first readable record, when the node answers with one.
fn first_offset(addr: SocketAddr, stream: &str) -> Option<u64> {
    let target = format!("{stream}?seq=-1&format=binary&bytes=1");
    let response = Client::new(addr).request("GET", &target, &[], b"")?;
    (response.status == 200).then_some(())?;
    decode_binary_read(&response.body)
        .first()
        .map(|record| record.seq)
}

fn read_stream(addr: SocketAddr, stream: &str) -> Result<Vec<(u64, Vec<u8>)>, String> {
    let mut client = Client::new(addr);
    let mut records = Vec::new();
    // Negative: wherever the stream starts now.
    let mut next: Option<u64> = None;
    let deadline = Instant::now() + READ_BOUND;
    let mut last = String::from("no answer");
    loop {
        if Instant::now() > deadline {
            return Err(format!(
                "reading {stream} at {next:?} did not finish: {last}"
            ));
        }
        let seq = next.map_or("-1".to_string(), |n| n.to_string());
        let target = format!("{stream}?seq={seq}&format=binary&bytes=1048576");
        let response = match client.request("GET", &target, &[], b"") {
            Some(r) if r.status == 200 => r,
            Some(r) if r.status == 404 && next.is_none() => return Ok(Vec::new()),
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
        let page_next = response.h_u64("pico-next-seq");
        let from = next.unwrap_or(page_next - page.len() as u64);
        if let Some(first) = page.first() {
            if first.seq != from {
                return Err(format!(
                    "a page of {stream} from {from} starts at {}",
                    first.seq
                ));
            }
        }
        if page_next != from + page.len() as u64 {
            return Err(format!(
                "a page of {stream} from {from} with {} records says next {page_next}",
                page.len()
            ));
        }
        next = Some(page_next);
        let empty = page.is_empty();
        records.extend(page.into_iter().map(|r| (r.seq, r.body)));
        if response.header("pico-up-to-date") == Some("true") {
            return Ok(records);
        }
        if empty {
            return Err(format!(
                "an empty page of {stream} at {page_next} that is not up to date"
            ));
        }
    }
}
