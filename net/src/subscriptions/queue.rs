//! The deliveries waiting for a delivery thread: at most one waiting and one in flight per key
//! (a subscription, or another service's `deliver_for` key), served in turn, bounded by
//! [`QUEUED_DELIVERIES_MAX`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::registry::Job;
use crate::limits::QUEUED_DELIVERIES_MAX;

/// The deliveries waiting for a thread, and the threads once started.
pub(super) struct Queue {
    state: Mutex<QueueState>,
    wakeup: Condvar,
}

#[derive(Default)]
struct QueueState {
    /// Subscription (registry key) → its one waiting delivery.
    waiting: HashMap<String, Job>,
    /// Subscriptions with a waiting delivery and none in flight, in the order they are served.
    turns: VecDeque<String>,
    in_flight: HashSet<String>,
    threads_started: bool,
    closed: bool,
}

impl Queue {
    pub(super) fn new() -> Queue {
        Queue {
            state: Mutex::new(QueueState::default()),
            wakeup: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`; the first one calls `start_threads` (how many threads it started). `Err`
    /// gives the job back when [`QUEUED_DELIVERIES_MAX`] keys are already waiting or no thread
    /// runs.
    pub(super) fn push(
        &self,
        job: Job,
        start_threads: impl FnOnce() -> usize,
    ) -> Result<(), (Job, &'static str)> {
        let mut state = self.lock();
        if state.closed {
            return Err((job, "the node is shutting down"));
        }
        if !state.threads_started {
            state.threads_started = true;
            if start_threads() == 0 {
                // Deliveries then fail (and are retried, then given up) instead of the node.
                state.threads_started = false;
                return Err((job, "no webhook delivery thread is running"));
            }
        }
        let key = job.subscription.clone();
        if let Some(waiting) = state.waiting.get_mut(&key) {
            *waiting = job;
            return Ok(());
        }
        if state.waiting.len() >= QUEUED_DELIVERIES_MAX {
            return Err((job, "the delivery queue is full"));
        }
        state.waiting.insert(key.clone(), job);
        if !state.in_flight.contains(&key) {
            state.turns.push_back(key);
            self.wakeup.notify_one();
        }
        Ok(())
    }

    /// The next delivery, in turn; `None` once closed.
    pub(super) fn take(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            while let Some(key) = state.turns.pop_front() {
                if let Some(job) = state.waiting.remove(&key) {
                    state.in_flight.insert(key);
                    return Some(job);
                }
            }
            state = self.wakeup.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The delivery of subscription `key` is over: a delivery that waited meanwhile gets a turn.
    pub(super) fn finish(&self, key: &str) {
        let mut state = self.lock();
        state.in_flight.remove(key);
        if state.waiting.contains_key(key) {
            state.turns.push_back(key.to_string());
            self.wakeup.notify_one();
        }
    }

    /// Ends the threads once their current deliveries are over.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.wakeup.notify_all();
    }
}
