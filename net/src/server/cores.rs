//! One pinned glommio executor per core: each starts its engine core, binds every listener
//! (sharing the port through `SO_REUSEPORT`; core 0 also runs the admin listener), reports
//! ready, serves until shutdown, then drains its connections and uploads what it holds.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use futures_rustls::TlsAcceptor;
use glommio::{ExecutorJoinHandle, LocalExecutorBuilder, Placement};
use pico_engine::{CoreHandle, CoreSeed};

use super::error::{CoreStartError, StartError};
use super::listeners::{spawn_admin, spawn_data_listener, DataServing};
use super::ports;
use crate::admin::metrics::HttpMetrics;
use crate::admin::{AdminState, NodeFacts};
use crate::auth::CoreTokens;
use crate::config::Protocol;
use crate::ds::DsSettings;
use crate::limits::{BodyBudget, ConnectionBudget, ConnectionLimits};
use crate::pico::PicoSettings;
use crate::shutdown::Shutdown;

/// Graceful shutdown: how long in-flight requests get to finish, and how long the final
/// upload may take.
const SHUTDOWN_CONNECTIONS_WAIT: Duration = Duration::from_secs(10);
const SHUTDOWN_FLUSH_WAIT: Duration = Duration::from_secs(15);
/// io_uring registered-buffer memory per core: glommio's minimum. Registering pins it from
/// the start (resident, and charged to the locked-memory limit once for each of a core's three
/// rings), while the DMA buffers the WAL asks for (256 KiB steps and up) never fit in it:
/// 1 MiB a core pinned 3 MiB and kept 1.4 MiB of a 2-core node's 15 MB idle RSS, for no
/// measurable gain in W1, W3 or a lone writer's latency (BENCHMARKS.md, "Idle memory").
const IO_MEMORY_PER_CORE_BYTES: usize = 64 << 10;
/// The longest a core runs queued tasks before it looks at its I/O completions and at what
/// other cores sent it. glommio does both only between runs of a task queue, and its default
/// (100 ms) lets one run of 5,000 SSE deliveries hold back every message from the other core:
/// an append whose connection is on one core and whose stream on the other waits 37-73 ms for
/// its acknowledgement under fan-out at 100 ms, 2.4-3.4 ms at 1-2 ms
/// (docs/decisions/2026-12-core-preemption-timer.md). A run cut short costs one timer rearm,
/// not a task switch. A timer this short expires before a run more often; the vendored glommio
/// runs at least one task per run, so that cannot leave the core asleep with work queued
/// (vendor/glommio/PATCHES.md, change 4).
const CORE_PREEMPT_INTERVAL_MS: u64 = 2;

/// What a core reports once it listens.
struct Started {
    /// The bound address of each listener, in the job's order.
    listens: Vec<SocketAddr>,
    admin: Option<SocketAddr>,
}

/// What every core is started with, each its own clone.
#[derive(Clone)]
pub(super) struct NodeJob {
    pub(super) tls: Option<Arc<rustls::ServerConfig>>,
    pub(super) serving: Arc<AtomicBool>,
    pub(super) settings: PicoSettings,
    pub(super) ds_settings: DsSettings,
    pub(super) max_body_size: usize,
    pub(super) request_timeout: Duration,
    pub(super) send_stall_timeout: Duration,
    pub(super) in_flight_bytes_max: usize,
    pub(super) unsent_bytes_max: usize,
    /// Open connections a core's protocol listeners take together.
    pub(super) connections_per_core_max: usize,
    /// The accept queue of each listener (`--backlog`).
    pub(super) backlog: u32,
    pub(super) shutdown: Shutdown,
    pub(super) stopped: mpsc::Sender<Stopped>,
}

/// One core's job: its engine seed, the listeners, its counters, core 0's admin listener.
struct CoreJob {
    /// Core 0: it binds the listeners first and checks that no other socket listens there.
    first: bool,
    seed: CoreSeed,
    listeners: Vec<(SocketAddr, Protocol)>,
    admin: Option<AdminJob>,
    http: Arc<HttpMetrics>,
    ready: mpsc::Sender<Result<Started, CoreStartError>>,
    node: NodeJob,
}

/// A core's report at the end of a graceful shutdown.
pub(super) struct Stopped {
    pub(super) core: usize,
    pub(super) open_connections: u64,
    pub(super) flushed: bool,
}

/// What core 0 needs to run the admin listener.
pub(super) struct AdminJob {
    pub(super) addr: SocketAddr,
    pub(super) facts: NodeFacts,
    pub(super) scheme: &'static str,
    pub(super) engine_metrics: pico_engine::metrics::NodeMetrics,
    pub(super) http_metrics: Vec<Arc<HttpMetrics>>,
}

/// Starts one executor per seed, one at a time: core 0 binds the listeners' addresses (port 0
/// picks a free one), written back into `listeners`, and the others share them.
/// Core 0 also runs `admin`. Returns the executors and the admin listener's address.
pub(super) fn start_cores(
    seeds: Vec<CoreSeed>,
    available: usize,
    listeners: &mut [(SocketAddr, Protocol)],
    node: NodeJob,
    mut admin: Option<AdminJob>,
    http_metrics: &[Arc<HttpMetrics>],
) -> Result<(Vec<ExecutorJoinHandle<()>>, Option<SocketAddr>), StartError> {
    let cores = seeds.len();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Started, CoreStartError>>();
    let mut admin_addr = None;
    let mut handles = Vec::new();
    for (index, seed) in seeds.into_iter().enumerate() {
        let placement = if cores <= available {
            Placement::Fixed(index)
        } else {
            Placement::Unbound
        };
        let job = CoreJob {
            first: index == 0,
            seed,
            listeners: listeners.to_vec(),
            admin: if index == 0 { admin.take() } else { None },
            http: http_metrics[index].clone(),
            ready: ready_tx.clone(),
            node: node.clone(),
        };
        let handle = core_executor(placement, index)
            .spawn(move || run_core(job))
            .map_err(StartError::Executor)?;
        handles.push(handle);
        let started = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| StartError::CoreTimeout { core: index })??;
        if index == 0 {
            for (listener, addr) in listeners.iter_mut().zip(&started.listens) {
                listener.0 = *addr;
            }
            admin_addr = started.admin;
        }
    }
    Ok((handles, admin_addr))
}

/// The executor of core `index`, as every core of a node runs it.
fn core_executor(placement: Placement, index: usize) -> LocalExecutorBuilder {
    LocalExecutorBuilder::new(placement)
        .name(&format!("pico-core-{index}"))
        .io_memory(IO_MEMORY_PER_CORE_BYTES)
        .preempt_timer(Duration::from_millis(CORE_PREEMPT_INTERVAL_MS))
}

async fn run_core(job: CoreJob) {
    let CoreJob {
        first,
        seed,
        listeners,
        admin,
        http,
        ready,
        node,
    } = job;
    let NodeJob {
        tls,
        serving,
        settings,
        ds_settings,
        max_body_size,
        request_timeout,
        send_stall_timeout,
        in_flight_bytes_max,
        unsent_bytes_max,
        connections_per_core_max,
        backlog,
        shutdown,
        stopped,
    } = node;
    // One budget for the bodies all this core's connections are receiving.
    let bodies = BodyBudget::new(in_flight_bytes_max);
    let limits = ConnectionLimits {
        max_body_size,
        request_timeout,
        bodies,
        // One budget for the read answers all this core's connections hold unsent.
        answers: BodyBudget::new(unsent_bytes_max),
        send_stall_timeout,
    };
    let started = async {
        let core = CoreHandle::start(seed)
            .await
            .map_err(CoreStartError::Engine)?;
        let bind = |addr: SocketAddr| {
            // Core 0 binds first, and looks before and after (a server that bound in between);
            // the others join the port it holds.
            if first {
                if let Some(holder) = ports::listener_on(addr) {
                    return Err(CoreStartError::PortTaken { addr, holder });
                }
            }
            match ports::listen_shared(addr, backlog, first) {
                Ok((listener, None)) => Ok(listener),
                Ok((_, Some(holder))) => Err(CoreStartError::PortTaken { addr, holder }),
                Err(e) => Err(CoreStartError::Bind {
                    addr,
                    source: e.into(),
                }),
            }
        };
        let mut bound = Vec::new();
        for (addr, protocol) in &listeners {
            let listener = bind(*addr)?;
            let local = listener.local_addr().map_err(CoreStartError::LocalAddr)?;
            bound.push((listener, local, *protocol));
        }
        let admin_listener = match &admin {
            Some(job) => Some(bind(job.addr)?),
            None => None,
        };
        let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
        Ok::<_, CoreStartError>((core, bound, admin_listener, admin_addr))
    }
    .await;
    let (core, bound, admin_listener, admin_addr) = match started {
        Ok(parts) => parts,
        Err(message) => {
            let _ = ready.send(Err(message));
            return;
        }
    };
    settings.subscriptions.start_on_core(&core);
    // Each protocol's handlers name the other's listener to a request sent to the wrong one.
    let scheme = if tls.is_some() { "https" } else { "http" };
    for (_, addr, protocol) in &bound {
        match protocol {
            Protocol::DurableStreams => settings.durable_streams.set(scheme, *addr),
            Protocol::Pico => ds_settings.pico.set(scheme, *addr),
        }
    }
    let tls = tls.map(TlsAcceptor::from);
    let admin_tls = tls.clone();
    let stop = shutdown.on_this_core();
    // The core's executor runs until this task ends: connections and uploads finish first.
    let stopper = {
        let (stop, core, http) = (stop.clone(), core.clone(), http.clone());
        glommio::spawn_local(async move {
            stop.wait().await;
            core.begin_shutdown();
            let deadline = std::time::Instant::now() + SHUTDOWN_CONNECTIONS_WAIT;
            while http.connections.load(Ordering::Relaxed) > 0
                && std::time::Instant::now() < deadline
            {
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
            let open_connections = http.connections.load(Ordering::Relaxed);
            let flushed = core.flush(SHUTDOWN_FLUSH_WAIT).await;
            let _ = stopped.send(Stopped {
                core: core.core(),
                open_connections,
                flushed,
            });
        })
    };
    http.install_on_this_core();
    let tokens = settings.auth.clone().map(CoreTokens::new);
    if let (Some(admin_listener), Some(job)) = (admin_listener, admin) {
        let advertised = bound
            .first()
            .map(|(_, addr, _)| format!("{}://{addr}", job.scheme))
            .unwrap_or_default();
        let state = Rc::new(AdminState {
            serving,
            core: core.clone(),
            engine_metrics: job.engine_metrics,
            http_metrics: job.http_metrics,
            started: std::time::Instant::now(),
            facts: NodeFacts {
                advertised_address: advertised,
                ..job.facts
            },
            slots: Cell::new(job.facts.cores as u64),
            tokens: tokens.clone(),
            subscriptions: Some(settings.subscriptions.clone()),
            backup: Default::default(),
            verify: Default::default(),
            gc_holds: Default::default(),
            usage: Cell::new(Default::default()),
        });
        glommio::spawn_local(crate::admin::usage::refresh_loop(state.clone())).detach();
        spawn_admin(
            admin_listener,
            admin_tls,
            &limits,
            state,
            http.clone(),
            stop.clone(),
        );
    }
    let _ = ready.send(Ok(Started {
        listens: bound.iter().map(|(_, addr, _)| *addr).collect(),
        admin: admin_addr,
    }));
    let serving = DataServing {
        core,
        tls,
        tokens,
        settings: Rc::new(settings),
        ds_settings: Rc::new(ds_settings),
        limits,
        // One count for the connections of all this core's protocol listeners.
        connections: ConnectionBudget::new(connections_per_core_max),
        http,
        stop,
    };
    let mut loops = Vec::new();
    for (listener, _, protocol) in bound {
        loops.push(spawn_data_listener(listener, protocol, &serving));
    }
    for task in loops {
        task.await;
    }
    stopper.await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    /// How long the other thread watches the busy core after sending it a message.
    const WATCH_MS: u64 = 400;
    /// The busy task gives up here, whatever happened.
    const BUSY_FOR_MAX: Duration = Duration::from_secs(30);

    /// A core that never runs out of tasks still takes another core's message within
    /// `CORE_PREEMPT_INTERVAL_MS`. Measured in the busy task's own progress, not in time: the
    /// message must arrive within the first eighth of what the core got done in `WATCH_MS`
    /// after the sending (50 ms of work on an idle machine; glommio's default look every
    /// 100 ms fails this). A busy machine that takes the core off its CPU slows both counts
    /// alike, so it cannot make the test fail.
    #[test]
    fn a_busy_core_still_takes_messages_from_other_cores() {
        let spins = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = mpsc::channel();
        let (message_tx, message_rx) = futures_channel::oneshot::channel::<u64>();
        let (core_spins, core_stop) = (spins.clone(), stop.clone());
        let core = core_executor(Placement::Unbound, 0)
            .spawn(move || async move {
                let received = Rc::new(Cell::new(None));
                let receiver = {
                    let (received, spins) = (received.clone(), core_spins.clone());
                    glommio::spawn_local(async move {
                        if let Ok(sent_at) = message_rx.await {
                            received.set(Some((sent_at, spins.load(Ordering::Relaxed))));
                        }
                    })
                };
                // Busy the way a core delivering to thousands of subscribers is: never
                // waiting, only yielding, so its task queue never runs dry.
                let began = std::time::Instant::now();
                let _ = started_tx.send(());
                while !core_stop.load(Ordering::Relaxed) && began.elapsed() < BUSY_FOR_MAX {
                    core_spins.fetch_add(1, Ordering::Relaxed);
                    futures_lite::future::yield_now().await;
                }
                drop(receiver);
                received.get()
            })
            .unwrap();
        started_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        // Read after sending would be later than the real moment of sending; read before, it
        // can only be earlier, which errs towards failing, never towards passing by luck.
        let sent_at = spins.load(Ordering::Relaxed);
        message_tx.send(sent_at).unwrap();
        std::thread::sleep(Duration::from_millis(WATCH_MS));
        let watched = spins.load(Ordering::Relaxed) - sent_at;
        stop.store(true, Ordering::Relaxed);
        let (sent_at, received_at) = core
            .join()
            .unwrap()
            .expect("the busy core never took the message");
        let waited = received_at - sent_at;
        assert!(
            waited <= watched / 8,
            "the busy core spun {waited} times before it took the message, of {watched} in {WATCH_MS} ms"
        );
    }

    /// Rounds of the test below: each one spawns a task and waits for it.
    const EARLY_PREEMPTION_ROUNDS: usize = 2_000;

    /// An executor whose preemption timer expired before it ran its queued tasks (its thread
    /// was taken off the CPU between arming the timer and running them, as on a machine with
    /// more runnable threads than CPUs) runs them, instead of going to sleep with them queued.
    /// Unpatched, glommio takes that case for "nothing to run" and sleeps until an unrelated
    /// event wakes it: a node's core 1 would not start within 30 s under CI with both CPUs
    /// hogged (vendor/glommio/PATCHES.md, change 4). A timer of 1 µs expires before the check
    /// nearly every time, so an executor without the fix hangs within a few rounds; the
    /// deadline bounds the wait.
    #[test]
    fn an_early_preemption_never_leaves_tasks_queued_while_the_core_sleeps() {
        let (done_tx, done_rx) = mpsc::channel();
        let core = LocalExecutorBuilder::new(Placement::Unbound)
            .preempt_timer(Duration::from_micros(1))
            .spawn(move || async move {
                for round in 0..EARLY_PREEMPTION_ROUNDS {
                    let task = glommio::spawn_local(async move {
                        futures_lite::future::yield_now().await;
                        round
                    });
                    assert_eq!(task.await, round);
                }
                let _ = done_tx.send(());
            })
            .unwrap();
        done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the executor slept with tasks queued");
        core.join().unwrap();
    }

    /// How long the test below waits for the write to reach the file.
    const SUBMITTED_WRITE_WAIT: Duration = Duration::from_secs(20);

    /// A DMA write (a commit round's) goes to the kernel when the task asks for it, not when
    /// the task queue's run ends: the disk then works while the core answers the round's
    /// appends and reads the next requests (vendor/glommio/PATCHES.md, change 7). The task
    /// polls the write once and then holds its thread, never yielding, until the bytes are in
    /// the file; unpatched, the request waits in glommio's queue for the run to end and the
    /// deadline fails the test.
    #[test]
    fn a_dma_write_reaches_the_kernel_before_its_task_yields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("submitted-at-once");
        let core = LocalExecutorBuilder::new(Placement::Unbound)
            .spawn(move || async move {
                let file = glommio::io::DmaFile::create(&path).await.unwrap();
                let mut block = file.alloc_dma_buffer(4096);
                block.as_bytes_mut().fill(0x5a);
                let mut write = std::pin::pin!(file.write_at(block, 0));
                // One poll hands the request over; the loop below blocks the thread.
                let early = futures_lite::future::poll_once(write.as_mut()).await;
                let deadline = std::time::Instant::now() + SUBMITTED_WRITE_WAIT;
                let reached = loop {
                    let bytes = std::fs::read(&path).unwrap();
                    if bytes.len() == 4096 && bytes.iter().all(|&b| b == 0x5a) {
                        break true;
                    }
                    if std::time::Instant::now() > deadline {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                };
                let written = match early {
                    Some(written) => written,
                    None => write.await,
                };
                assert_eq!(written.unwrap(), 4096);
                reached
            })
            .unwrap();
        assert!(
            core.join().unwrap(),
            "the write did not reach the file within {SUBMITTED_WRITE_WAIT:?} while its task held the thread"
        );
    }

    /// Sleeps of the test below, each of 1 ms.
    const TIMED_SLEEPS: u64 = 200;

    /// `io_uring_enter` calls a core may make for one sleep and the pass that follows it:
    /// arming its preemption timer on waking, and, to sleep again, swapping that timer for the
    /// next user timer in one submission and submitting the rings' link while it waits in one
    /// call, with one spare for a timer that fired on a busy machine.
    const ENTERS_PER_SLEEP_MAX: u64 = 4;

    /// A core that wakes, runs a task and sleeps again keeps its timers armed while they
    /// still serve, instead of cancelling and arming them on every pass of its run loop
    /// (vendor/glommio/PATCHES.md, change 11): a lone request costs a core two such cycles, on
    /// its arrival and on its write's completion. Unpatched, each cycle made six calls to
    /// submit (a cancellation, the throughput timer's re-arming and a new preemption timer
    /// on each pass, then the rings' link) besides the wait itself.
    #[test]
    fn a_core_that_wakes_and_sleeps_again_keeps_its_timers_armed() {
        let core = core_executor(Placement::Unbound, 0)
            .spawn(|| async {
                let executor = glommio::executor();
                // Warm up, then count from zero (reading the statistics resets them).
                glommio::timer::sleep(Duration::from_millis(1)).await;
                let _ = executor.io_stats();
                for _ in 0..TIMED_SLEEPS {
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                let stats = executor.io_stats();
                stats.main_ring.kernel_enters() + stats.latency_ring.kernel_enters()
            })
            .unwrap();
        let enters = core.join().unwrap();
        assert!(
            enters <= ENTERS_PER_SLEEP_MAX * TIMED_SLEEPS,
            "{enters} calls to io_uring_enter for {TIMED_SLEEPS} sleeps"
        );
    }

    /// Rounds of the test below, each a timer and a wake-up just before it expires.
    const TIMER_RACE_ROUNDS: u64 = 2_000;
    /// How long a round's timer waits at least.
    const TIMER_RACE_WAIT_US: u64 = 150;
    /// How long the other thread waits for a round's timer to fire before it calls it lost.
    const TIMER_LOST_AFTER: Duration = Duration::from_secs(10);

    /// A core woken by I/O just before its timer expires, that goes back to sleep with the
    /// timer still armed, still wakes for the timer (vendor/glommio/PATCHES.md, change 11).
    /// A kept timer can fire between the reactor's first look at its rings and the look just
    /// before it sleeps; that second look takes the completion, and a core that then slept
    /// would wait for a timer no longer armed, until some unrelated event (an object-durability
    /// append waited out its client's deadline). Each round arms a timer and has another
    /// thread send the core a byte within 40 µs of its expiry, then nothing until the timer
    /// fires: a lost timer leaves the round waiting, and the thread gives up after
    /// `TIMER_LOST_AFTER`.
    #[test]
    fn a_timer_that_expires_as_the_core_goes_back_to_sleep_still_wakes_it() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let (mut sender, mut receiver) = std::os::unix::net::UnixStream::pair().unwrap();
        receiver.set_nonblocking(true).unwrap();
        let base = std::time::Instant::now();
        // The round under way (counted from 1) and its timer's deadline, in ns from `base`.
        let (round_now, deadline_ns) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (fired_tx, fired_rx) = mpsc::channel::<u64>();
        let (published_round, published_deadline) = (round_now.clone(), deadline_ns.clone());
        let core = core_executor(Placement::Unbound, 0)
            .spawn(move || async move {
                let reader = glommio::spawn_local(async move {
                    let mut bytes = [0u8; 64];
                    loop {
                        if glommio::net::poll_readable(receiver.as_raw_fd())
                            .await
                            .is_err()
                        {
                            return;
                        }
                        match receiver.read(&mut bytes) {
                            Ok(0) => return,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(_) => return,
                        }
                    }
                })
                .detach();
                for round in 0..TIMER_RACE_ROUNDS {
                    let wait = Duration::from_micros(TIMER_RACE_WAIT_US + round % 50);
                    let deadline = std::time::Instant::now() + wait;
                    published_deadline
                        .store((deadline - base).as_nanos() as u64, Ordering::Relaxed);
                    published_round.store(round + 1, Ordering::Release);
                    glommio::timer::sleep(wait).await;
                    if fired_tx.send(round).is_err() {
                        break;
                    }
                }
                reader.cancel();
            })
            .unwrap();
        let mut lost = None;
        for round in 0..TIMER_RACE_ROUNDS {
            // The round's deadline, then a byte within 40 µs of it. A thread late enough that
            // the round's timer already fired sends its byte at once.
            let published_by = std::time::Instant::now() + TIMER_LOST_AFTER;
            while round_now.load(Ordering::Acquire) <= round
                && std::time::Instant::now() < published_by
            {
                std::hint::spin_loop();
            }
            let deadline = deadline_ns.load(Ordering::Relaxed);
            let send_at = base + Duration::from_nanos(deadline.saturating_sub(round % 40 * 1_000));
            while std::time::Instant::now() < send_at
                && round_now.load(Ordering::Acquire) == round + 1
            {
                std::hint::spin_loop();
            }
            sender.write_all(&[1]).unwrap();
            match fired_rx.recv_timeout(TIMER_LOST_AFTER) {
                Ok(fired) => assert_eq!(fired, round),
                Err(_) => {
                    lost = Some(round);
                    break;
                }
            }
        }
        // A lost timer's round ends with the next event: this byte, or the stream's end.
        drop(fired_rx);
        let _ = sender.write_all(&[1]);
        drop(sender);
        core.join().unwrap();
        assert_eq!(
            lost, None,
            "a round's timer did not wake the core within {TIMER_LOST_AFTER:?}"
        );
    }

    /// Rounds of the test below, each a wake-up from another thread around the moment the
    /// core goes to sleep.
    const FOREIGN_WAKE_ROUNDS: u64 = 5_000;
    /// A round whose wake-up did not reach the core within this long was lost.
    const FOREIGN_WAKE_LOST_AFTER: Duration = Duration::from_secs(10);

    /// A task woken from another thread just as its core goes to sleep (the core's store of
    /// "I sleep" and its last look at its queue of wakers against the thread's push and its
    /// look at that flag) is always run: a core going to sleep orders the two with a fence,
    /// and so does every waking thread (vendor/glommio/PATCHES.md, change 13). Each round the
    /// core hands the thread a oneshot's sender and waits for it; the thread completes it
    /// 0-40 µs after receiving it, so the wake lands before, during and after the core's way
    /// into its sleep. A lost wake-up leaves the core asleep until the deadline.
    #[test]
    fn a_task_woken_from_another_thread_as_its_core_goes_to_sleep_always_runs() {
        let (senders_tx, senders_rx) = mpsc::channel::<futures_channel::oneshot::Sender<u64>>();
        let (done_tx, done_rx) = mpsc::channel::<u64>();
        let core = core_executor(Placement::Unbound, 0)
            .spawn(move || async move {
                for round in 0..FOREIGN_WAKE_ROUNDS {
                    let (tx, rx) = futures_channel::oneshot::channel();
                    if senders_tx.send(tx).is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(got) if got == round => {}
                        _ => return,
                    }
                    if done_tx.send(round).is_err() {
                        return;
                    }
                }
            })
            .unwrap();
        let mut lost = None;
        for round in 0..FOREIGN_WAKE_ROUNDS {
            let Ok(tx) = senders_rx.recv_timeout(FOREIGN_WAKE_LOST_AFTER) else {
                lost = Some(round);
                break;
            };
            let send_at = std::time::Instant::now() + Duration::from_micros(round % 41);
            while std::time::Instant::now() < send_at {
                std::hint::spin_loop();
            }
            let _ = tx.send(round);
            match done_rx.recv_timeout(FOREIGN_WAKE_LOST_AFTER) {
                Ok(done) => assert_eq!(done, round),
                Err(_) => {
                    lost = Some(round);
                    break;
                }
            }
        }
        // A core that lost a wake-up sleeps on with nothing to wake it: the test fails
        // without joining it.
        assert_eq!(
            lost, None,
            "a round's wake-up did not reach the core within {FOREIGN_WAKE_LOST_AFTER:?}"
        );
        core.join().unwrap();
    }

    /// A commit round's durable write (`RWF_DSYNC`, vendor/glommio/PATCHES.md, change 10) from
    /// a buffer of the core's registered I/O memory and from one too large for it: the kernel
    /// takes the flag on both paths, and the bytes are in the file when the write completes.
    /// What survives a power cut is the power-cut test's (`cli/tests/power_cut.rs`).
    #[test]
    fn a_durable_write_from_registered_and_plain_buffers_holds_its_bytes_when_it_completes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("durable");
        let core = core_executor(Placement::Unbound, 0)
            .spawn(move || async move {
                let file = glommio::io::DmaFile::create(&path).await.unwrap();
                let mut written = Vec::new();
                let mut at = 0u64;
                for (len, byte) in [(4096, 0x11u8), (IO_MEMORY_PER_CORE_BYTES * 4, 0x22)] {
                    let mut block = file.alloc_dma_buffer(len);
                    block.as_bytes_mut().fill(byte);
                    let block = std::rc::Rc::new(block);
                    let wrote = file.write_rc_at_durable(block, at).await.unwrap();
                    assert_eq!(wrote, len);
                    written.extend(std::iter::repeat_n(byte, len));
                    at += len as u64;
                    assert!(
                        std::fs::read(&path).unwrap() == written,
                        "the file holds what was written durably ({len} bytes of {byte:#x})"
                    );
                }
                file.close().await.unwrap();
            })
            .unwrap();
        core.join().unwrap();
    }
}
