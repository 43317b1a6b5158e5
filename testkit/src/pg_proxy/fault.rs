//! What the test's handle and the proxy's threads share: the faults armed, the holds
//! running, the open connections and the counts.

use super::*;

/// What the test's handle and the proxy's threads share.
pub(super) struct Shared {
    pub(super) upstream: SocketAddr,
    pub(super) stop: AtomicBool,
    pub(super) refuse: AtomicBool,
    /// [`Fault::LoseCommitAnswer`]s not used yet.
    pub(super) armed_losses: AtomicU64,
    /// [`Fault::LoseCommitAnswerAfter`]s not used yet, in the order injected.
    pub(super) armed_after: Mutex<Vec<&'static str>>,
    /// [`Fault::DelayStatementsFrom`]s not used yet, in the order injected.
    pub(super) armed_delays: Mutex<Vec<(&'static str, Duration)>>,
    /// [`Fault::DelayStatementsFrom`]s that found their statement.
    pub(super) delays_started: AtomicU64,
    pub(super) answers_held_until: Mutex<Option<Instant>>,
    pub(super) statements_delayed_until: Mutex<Option<Instant>>,
    /// Open connections by id.
    pub(super) links: Mutex<HashMap<u64, Arc<Link>>>,
    /// One per connection (its statements thread), joined on drop; finished ones are dropped
    /// as new connections come.
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(super) next_link: AtomicU64,
    pub(super) lost_tags: Mutex<Vec<String>>,
    pub(super) accepted: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) turns: AtomicU64,
    pub(super) commits: AtomicU64,
    pub(super) commit_answers_lost: AtomicU64,
    pub(super) cut: AtomicU64,
}

/// Locks, ignoring poisoning: every value behind these locks stays valid whatever panicked.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Moves a hold's end to `period` from now, unless it already ends later.
pub(super) fn extend(until: &Mutex<Option<Instant>>, period: Duration) {
    let end = Instant::now() + period;
    let mut until = lock(until);
    *until = Some(until.map_or(end, |current| current.max(end)));
}

impl Shared {
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(super) fn cut_all(&self) {
        let links: Vec<Arc<Link>> = lock(&self.links).values().cloned().collect();
        for link in links {
            if link.close() {
                self.cut.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Starts forwarding a new connection, or closes it (refusing, full, stopping).
    pub(super) fn admit(self: &Arc<Self>, client: TcpStream) {
        let mut threads = lock(&self.threads);
        threads.retain(|thread| !thread.is_finished());
        let full = threads.len() >= CONNECTIONS_MAX;
        if full || self.refuse.load(Ordering::SeqCst) || self.stopped() {
            self.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("pg-proxy-link".into())
            .spawn(move || run_link(&shared, client));
        match spawned {
            Ok(thread) => {
                self.accepted.fetch_add(1, Ordering::SeqCst);
                threads.push(thread);
            }
            // The client (moved into the closure) is closed with it.
            Err(_) => {
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Waits while `until` (a hold or a delay) is in the future, the proxy runs and `link` is
    /// open. Ends at the latest deadline injected meanwhile.
    pub(super) fn wait_out(&self, until: &Mutex<Option<Instant>>, link: &Link) {
        loop {
            let Some(deadline) = *lock(until) else {
                return;
            };
            let now = Instant::now();
            if now >= deadline || self.stopped() || link.is_closed() {
                return;
            }
            std::thread::sleep((deadline - now).min(POLL));
        }
    }

    /// A loss armed for a COMMIT of a transaction that ran `ran`, used up; `false` when none
    /// is armed for it.
    pub(super) fn take_loss(&self, ran: &Ran) -> bool {
        let any = self
            .armed_losses
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if any.is_ok() {
            return true;
        }
        let mut after = lock(&self.armed_after);
        let matching = after.iter().position(|statement| ran.contains(statement));
        matching.map(|at| after.remove(at)).is_some()
    }

    /// The delay armed for a statement of text `sql`, used up; `None` when none is armed for
    /// it.
    pub(super) fn take_delay(&self, sql: &str) -> Option<Duration> {
        let mut armed = lock(&self.armed_delays);
        let at = armed
            .iter()
            .position(|(statement, _)| sql.contains(statement))?;
        self.delays_started.fetch_add(1, Ordering::SeqCst);
        Some(armed.remove(at).1)
    }

    pub(super) fn record_lost(&self, tag: String) {
        let mut tags = lock(&self.lost_tags);
        if tags.len() < LOST_TAGS_MAX {
            tags.push(tag);
        }
    }
}
