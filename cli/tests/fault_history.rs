//! The fault test (docs/durability.md): writers and readers over both protocols record every
//! operation, with its invoke and completion time and its answer, while a nemesis injects
//! faults into a real node: `kill -9` and restart, `SIGSTOP` (clients time out) then
//! `SIGCONT`, and a full WAL disk (a tmpfs kept full) that is freed again. Afterwards
//! `pico_testkit::history::check` verifies the history against a final read of each stream:
//! every acknowledged append exactly once at its offset, dense offsets, nothing never sent,
//! readers never going back, nothing served that a crash then took back, failed appends and
//! producer retries stored at most once.
//!
//! Writers: two plain Pico writers, a Durable Streams idempotent producer (it retries a
//! sequence number until it gets an answer) and a plain Durable Streams writer. Readers: a
//! Pico long-poll reader and a Durable Streams long-poll reader, each tailing its stream.
//!
//! Two profiles: a node on SQLite and `file://` with its WAL on a tmpfs (kills, pauses, a
//! full disk), and a node on a Postgres and a Garage of the test's own, with object
//! durability (kills, pauses, Postgres stopped and started, Garage killed and restarted).
//! CI runs each for `FAULT_TEST_SEC` (default 40 s of faults). The soak is
//!
//!     FAULT_TEST_SEC=1800 cargo test -p pico-cli --test fault_history -- --include-ignored --nocapture
//!
//! and `FAULT_SEED=<n>` replays a schedule of faults (thread timing still varies). Without
//! root (no tmpfs) the disk-full fault is left out, with a note (a failure under `CI=true`).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::disk::{Filler, Tmpfs};
use common::services::{storage, PrivatePostgres};
use common::{decode_binary_read, read_all, Conn, Resp, Server};
use pico_testkit::garage::OwnGarage;
use pico_testkit::history::{check, Append, History, Outcome, Read};

const PICO_STREAM: &str = "/h/pico";
const DS_STREAM: &str = "/h/ds";
/// Operations per client at most, whatever the duration (every loop is bounded).
const OPS_PER_CLIENT_MAX: u64 = 2_000_000;

/// Where the node listens now (a restart moves it to new ports).
#[derive(Clone, Copy)]
struct Addrs {
    pico: SocketAddr,
    ds: SocketAddr,
}

struct Shared {
    addrs: Mutex<Addrs>,
    stop: AtomicBool,
    started: Instant,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn addrs(&self) -> Addrs {
        *self.addrs.lock().unwrap()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// A client connection that reconnects (to wherever the node is now) after any failure.
struct Client {
    shared: Arc<Shared>,
    ds: bool,
    conn: Option<Conn>,
}

impl Client {
    fn new(shared: &Arc<Shared>, ds: bool) -> Client {
        Client {
            shared: shared.clone(),
            ds,
            conn: None,
        }
    }

    /// The answer, or `None` when the connection failed (the request's outcome is unknown).
    fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<Resp> {
        if self.conn.is_none() {
            let addrs = self.shared.addrs();
            let addr = if self.ds { addrs.ds } else { addrs.pico };
            match Conn::connect(addr) {
                Ok(mut conn) => {
                    conn.set_read_timeout(Duration::from_secs(5));
                    self.conn = Some(conn);
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    return None;
                }
            }
        }
        let conn = self.conn.as_mut()?;
        match conn.request(method, path, headers, body) {
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

/// What the writers were answered: how often each status (0: no answer), and the answers no
/// fault explains.
#[derive(Clone, Default)]
struct Answers {
    statuses: Arc<Mutex<std::collections::BTreeMap<u16, u64>>>,
    surprises: Arc<Mutex<Vec<String>>>,
}

impl Answers {
    /// Counts an append's answer; a refusal (a full disk, a stopped core) is followed by a
    /// short pause, so a writer does not spin on it.
    fn tally(&self, response: Option<&Resp>, acked: bool) {
        *self
            .statuses
            .lock()
            .unwrap()
            .entry(response.map_or(0, |r| r.status))
            .or_default() += 1;
        if let Some(r) = response {
            if !expected_status(r.status) {
                self.surprises.lock().unwrap().push(r.describe());
            }
            if !acked {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Statuses a client may get while faults last; anything else fails the test.
fn expected_status(status: u16) -> bool {
    matches!(status, 200 | 204 | 429 | 500 | 503 | 507)
}

type Log = Arc<Mutex<History>>;

fn pico_writer(shared: Arc<Shared>, id: usize, log: Log, answers: Answers) {
    let mut client = Client::new(&shared, false);
    for n in 0..OPS_PER_CLIENT_MAX {
        if shared.stopped() {
            return;
        }
        // 2 KiB: enough bytes that a full disk is felt within a fault's time.
        let body = format!("pico-w{id}-{n}-{}", "x".repeat(2048));
        let invoked_ms = shared.now_ms();
        let response = client.request("POST", PICO_STREAM, &[], body.as_bytes());
        let outcome = match &response {
            Some(r) if r.status == 200 => Outcome::Acked {
                offset: Some(r.h_u64("pico-start-seq")),
            },
            _ => Outcome::NotAcked,
        };
        answers.tally(response.as_ref(), outcome != Outcome::NotAcked);
        log.lock().unwrap().appends.push(Append {
            client: format!("pico-w{id}"),
            body: body.into_bytes(),
            invoked_ms,
            completed_ms: shared.now_ms(),
            outcome,
        });
    }
}

/// A Durable Streams writer: with `producer`, an idempotent producer that resends one
/// sequence number (same body) until it is answered `2xx`.
fn ds_writer(shared: Arc<Shared>, producer: bool, log: Log, answers: Answers) {
    let mut client = Client::new(&shared, true);
    let name = if producer { "ds-producer" } else { "ds-w" };
    let mut seq = 0u64;
    for _ in 0..OPS_PER_CLIENT_MAX {
        if shared.stopped() {
            return;
        }
        let body = format!("\"{name}-{seq}\"");
        let seq_text = seq.to_string();
        let mut headers = vec![("content-type", "application/json")];
        if producer {
            headers.extend([
                ("producer-id", "p1"),
                ("producer-epoch", "0"),
                ("producer-seq", seq_text.as_str()),
            ]);
        }
        let invoked_ms = shared.now_ms();
        let response = client.request("POST", DS_STREAM, &headers, body.as_bytes());
        let acked = response
            .as_ref()
            .is_some_and(|r| r.status == 200 || r.status == 204);
        answers.tally(response.as_ref(), acked);
        log.lock().unwrap().appends.push(Append {
            client: name.into(),
            body: body.into_bytes(),
            invoked_ms,
            completed_ms: shared.now_ms(),
            outcome: if acked {
                Outcome::Acked { offset: None }
            } else {
                Outcome::NotAcked
            },
        });
        if acked || !producer {
            seq += 1;
        }
    }
}

fn pico_reader(shared: Arc<Shared>, log: Log) {
    let mut client = Client::new(&shared, false);
    let mut next = 0u64;
    for _ in 0..OPS_PER_CLIENT_MAX {
        if shared.stopped() {
            return;
        }
        let path = format!("{PICO_STREAM}?seq={next}&format=binary&live=long-poll");
        let invoked_ms = shared.now_ms();
        let Some(response) = client.request("GET", &path, &[], b"") else {
            continue;
        };
        if response.status != 200 {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let records: Vec<(u64, Vec<u8>)> = decode_binary_read(&response.body)
            .into_iter()
            .map(|r| (r.seq, r.body))
            .collect();
        let from = next;
        next = response.h_u64("pico-next-seq").max(next);
        log.lock().unwrap().reads.push(Read {
            reader: "pico-reader".into(),
            from,
            records,
            invoked_ms,
            completed_ms: shared.now_ms(),
        });
    }
}

fn ds_reader(shared: Arc<Shared>, log: Log) {
    let mut client = Client::new(&shared, true);
    let mut next = 0u64;
    for _ in 0..OPS_PER_CLIENT_MAX {
        if shared.stopped() {
            return;
        }
        let offset = if next == 0 {
            "-1".to_string()
        } else {
            format!("{next:016}_{:016}", 0)
        };
        let path = format!("{DS_STREAM}?offset={offset}&live=long-poll");
        let invoked_ms = shared.now_ms();
        let Some(response) = client.request("GET", &path, &[], b"") else {
            continue;
        };
        if response.status != 200 {
            // 204: the long-poll timed out with nothing new.
            if response.status != 204 {
                std::thread::sleep(Duration::from_millis(20));
            }
            continue;
        }
        let messages: Vec<serde_json::Value> =
            serde_json::from_slice(&response.body).expect("a JSON array");
        let records: Vec<(u64, Vec<u8>)> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| (next + i as u64, m.to_string().into_bytes()))
            .collect();
        let next_offset = response.h("stream-next-offset");
        let next_seq: u64 = next_offset
            .split('_')
            .next()
            .and_then(|s| s.parse().ok())
            .expect("a Stream-Next-Offset");
        let from = next;
        assert_eq!(
            next_seq,
            next + records.len() as u64,
            "{}",
            response.describe()
        );
        next = next_seq;
        log.lock().unwrap().reads.push(Read {
            reader: "ds-reader".into(),
            from,
            records,
            invoked_ms,
            completed_ms: shared.now_ms(),
        });
    }
}

/// A small deterministic generator for the fault schedule (`FAULT_SEED` replays it).
struct Schedule(u64);

impl Schedule {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// A fault the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `kill -9` the node, start it again.
    Kill,
    /// `SIGSTOP` the node for up to 2.2 s (clients time out), then `SIGCONT`.
    Pause,
    /// Fill the WAL's tmpfs for 1 to 3 s, then free it.
    FullDisk,
    /// Stop Postgres (a fast shutdown drops every connection) for 1 to 3 s, then start it.
    MetaRestart,
    /// `kill -9` Garage, start it again 1 to 3 s later on the same data.
    StoreRestart,
}

/// What the node runs on, for the faults that need it.
#[derive(Default)]
struct Services {
    tmpfs: Option<Tmpfs>,
    postgres: Option<PrivatePostgres>,
    garage: Option<OwnGarage>,
}

fn duration_and_seed() -> (Duration, u64) {
    let duration = Duration::from_secs(
        std::env::var("FAULT_TEST_SEC")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(40),
    );
    let seed = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(clock_seed);
    (duration, seed)
}

/// Flags of every profile: small segments (a full disk is felt soon), short long-polls.
const NODE_FLAGS: [&str; 10] = [
    "--cores",
    "2",
    "--ds-listen",
    "127.0.0.1:0",
    "--segment-size",
    "256KiB",
    "--segment-max-age-ms",
    "200",
    "--long-poll-timeout-sec",
    "1",
];

#[test]
fn every_promise_holds_under_kills_pauses_and_a_full_disk() {
    let test = "every_promise_holds_under_kills_pauses_and_a_full_disk";
    let tmpfs = Tmpfs::mount(test, 24);
    let mut args: Vec<String> = NODE_FLAGS.iter().map(|s| s.to_string()).collect();
    let mut faults = vec![Fault::Kill, Fault::Pause];
    if let Some(tmpfs) = &tmpfs {
        args.extend(["--wal-dir".to_string(), tmpfs.path.display().to_string()]);
        faults.push(Fault::FullDisk);
    }
    let services = Services {
        tmpfs,
        ..Services::default()
    };
    run_fault_test(&args, &faults, services);
}

/// The deployment a cluster node has: metadata in Postgres, segments in Garage, and so
/// (by default) object durability; the faults include both services going away.
#[ignore = "needs Postgres and Garage: PICOMQ_PG_URL and PICOMQ_S3_ENDPOINT (scripts/pg-up.sh, scripts/garage-up.sh)"]
#[test]
fn every_promise_holds_on_postgres_and_garage_while_they_restart() {
    let test = "every_promise_holds_on_postgres_and_garage_while_they_restart";
    if pico_testkit::require(test, &pico_testkit::GARAGE).is_none() {
        return;
    }
    let Some(postgres) = PrivatePostgres::start(test) else {
        return;
    };
    let Some(garage) = OwnGarage::start(test) else {
        return;
    };
    let mut args: Vec<String> = NODE_FLAGS.iter().map(|s| s.to_string()).collect();
    args.extend([
        "--meta-url".to_string(),
        postgres.url(),
        "--storage".to_string(),
        storage(&garage.endpoint()),
    ]);
    let services = Services {
        postgres: Some(postgres),
        garage: Some(garage),
        ..Services::default()
    };
    let faults = [
        Fault::Kill,
        Fault::Pause,
        Fault::MetaRestart,
        Fault::StoreRestart,
    ];
    run_fault_test(&args, &faults, services);
}

fn run_fault_test(args: &[String], kinds: &[Fault], services: Services) {
    let (duration, seed) = duration_and_seed();
    eprintln!("fault test: {duration:?}, faults {kinds:?}, FAULT_SEED={seed}");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = Server::start(&args);
    server
        .put(PICO_STREAM, "application/octet-stream")
        .expect(201);
    let ds_addr = server.second.expect("the --ds-listen listener");
    let created = common::ds(
        ds_addr,
        "PUT",
        DS_STREAM,
        &[("content-type", "application/json")],
        b"",
    );
    created.expect(201);
    let shared = Arc::new(Shared {
        addrs: Mutex::new(Addrs {
            pico: server.addr,
            ds: ds_addr,
        }),
        stop: AtomicBool::new(false),
        started: Instant::now(),
    });
    let pico_log: Log = Arc::default();
    let ds_log: Log = Arc::default();
    let answers = Answers::default();
    let mut clients = Vec::new();
    for id in 0..2 {
        let (shared, log, answers) = (shared.clone(), pico_log.clone(), answers.clone());
        clients.push(std::thread::spawn(move || {
            pico_writer(shared, id, log, answers)
        }));
    }
    for producer in [true, false] {
        let (shared, log, answers) = (shared.clone(), ds_log.clone(), answers.clone());
        clients.push(std::thread::spawn(move || {
            ds_writer(shared, producer, log, answers)
        }));
    }
    let (reader_shared, log) = (shared.clone(), pico_log.clone());
    clients.push(std::thread::spawn(move || pico_reader(reader_shared, log)));
    let (reader_shared, log) = (shared.clone(), ds_log.clone());
    clients.push(std::thread::spawn(move || ds_reader(reader_shared, log)));

    // The nemesis.
    let mut schedule = Schedule(seed);
    let mut injected = std::collections::BTreeMap::<Fault, u32>::new();
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500 + schedule.next(1500)));
        let kind = kinds[schedule.next(kinds.len() as u64) as usize];
        *injected.entry(kind).or_default() += 1;
        let outage = Duration::from_millis(1000 + schedule.next(2000));
        match kind {
            Fault::Kill => {
                server.restart();
                *shared.addrs.lock().unwrap() = Addrs {
                    pico: server.addr,
                    ds: server.second.expect("the --ds-listen listener"),
                };
            }
            Fault::Pause => {
                let pid = server.pid().expect("the node runs") as i32;
                // SAFETY: kill(2) on our own child's pid; no memory is involved.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_millis(200 + schedule.next(2000)));
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            Fault::FullDisk => {
                let tmpfs = services
                    .tmpfs
                    .as_ref()
                    .expect("a full disk needs the tmpfs");
                let filler = Filler::start(&tmpfs.path);
                filler.wait_full();
                std::thread::sleep(outage);
                filler.release();
            }
            Fault::MetaRestart => {
                let postgres = services.postgres.as_ref().expect("Postgres");
                postgres.ctl("stop");
                std::thread::sleep(outage);
                postgres.ctl("start");
            }
            Fault::StoreRestart => {
                let garage = services.garage.as_ref().expect("Garage");
                garage.kill();
                std::thread::sleep(outage);
                garage.up();
            }
        }
        assert!(server.is_running(), "the node exited\n{}", server.log());
    }
    shared.stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("a client thread");
    }
    let surprises = answers.surprises.lock().unwrap().clone();
    assert!(surprises.is_empty(), "unexpected answers: {surprises:#?}");

    // One more restart, so the final read is what recovery found.
    server.restart();
    let mut violations = Vec::new();
    let mut report = Vec::new();
    for (name, log) in [(PICO_STREAM, &pico_log), (DS_STREAM, &ds_log)] {
        let (records, _) = read_all(&server, name, 0);
        let last: Vec<(u64, Vec<u8>)> = records.into_iter().map(|r| (r.seq, r.body)).collect();
        let history = log.lock().unwrap();
        let acked = history
            .appends
            .iter()
            .filter(|a| a.outcome != Outcome::NotAcked)
            .count();
        report.push(format!(
            "{name}: {} appends ({acked} acknowledged), {} reads, {} records after the last restart",
            history.appends.len(),
            history.reads.len(),
            last.len()
        ));
        violations.extend(check(&history, &last));
    }
    eprintln!(
        "fault test: {}; faults injected {injected:?}; append answers {:?}; {} violations",
        report.join("; "),
        answers.statuses.lock().unwrap(),
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "{} violations, FAULT_SEED={seed}:\n{violations:#?}\n{}",
        violations.len(),
        server.log()
    );
    // The node stops before the services under it.
    drop(server);
    drop(services);
}

/// A seed from the clock (printed, so a failing schedule can be replayed).
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}
