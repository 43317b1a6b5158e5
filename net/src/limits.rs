//! What one connection may hold and how long it may take, the same for HTTP/1.1 and HTTP/2
//! (docs/security.md lists every limit with its default and its error).
//!
//! Request bodies are counted from their first byte against the core's [`BodyBudget`], so the
//! memory held by uploads in progress is bounded by `--max-in-flight-bytes` per core whatever
//! clients do: a body that would pass it is refused with `429` instead of being buffered.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// Default time a request (head and body) has to arrive, and an idle connection stays open
/// (`--request-timeout-sec`).
pub const REQUEST_TIMEOUT_SEC_DEFAULT: u64 = 120;

/// Why a body was refused with `429`: the core's [`BodyBudget`] cannot hold it.
pub const BODIES_OVER_BUDGET: &str =
    "in-flight bytes per core: request bodies being received fill --max-in-flight-bytes";

/// The limits every connection of a listener is served with.
#[derive(Clone)]
pub struct ConnectionLimits {
    /// Largest request body (bytes); larger is `413`.
    pub max_body_size: usize,
    /// A request not received within this is `408`; a connection idle this long is closed
    /// (HTTP/2: with a GOAWAY).
    pub request_timeout: Duration,
    /// Bodies being received on this core.
    pub bodies: BodyBudget,
}

impl ConnectionLimits {
    /// Limits for tests and tools: a body limit, the default timeout, an unshared budget.
    pub fn with_body_limit(max_body_size: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_body_size,
            request_timeout: Duration::from_secs(REQUEST_TIMEOUT_SEC_DEFAULT),
            bodies: BodyBudget::new(usize::MAX),
        }
    }
}

/// Bytes of request bodies one core is receiving or handling, against a maximum. One per
/// core, shared by its connections (so not `Send`).
#[derive(Clone)]
pub struct BodyBudget {
    shared: Rc<Budget>,
}

struct Budget {
    held_bytes: Cell<usize>,
    max_bytes: usize,
}

impl BodyBudget {
    pub fn new(max_bytes: usize) -> BodyBudget {
        BodyBudget {
            shared: Rc::new(Budget {
                held_bytes: Cell::new(0),
                max_bytes,
            }),
        }
    }

    /// An empty reservation of one request's body.
    pub fn reservation(&self) -> BodyReservation {
        BodyReservation {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// Bytes held now, by all reservations.
    pub fn held_bytes(&self) -> usize {
        self.shared.held_bytes.get()
    }
}

/// One request body's share of its core's [`BodyBudget`]; given back when dropped (once the
/// request was answered).
pub struct BodyReservation {
    budget: BodyBudget,
    bytes: usize,
}

impl BodyReservation {
    /// Grows this reservation to `total` bytes; `false` (and unchanged) when the core cannot
    /// hold them. A core holding nothing else always takes one body, however large, so a
    /// budget below `--max-body-size` still lets every body through one at a time.
    #[must_use]
    pub fn grow_to(&mut self, total: usize) -> bool {
        let Some(more) = total.checked_sub(self.bytes).filter(|&more| more > 0) else {
            return true;
        };
        let shared = &self.budget.shared;
        let held = shared.held_bytes.get();
        let alone = held == self.bytes;
        let fits = held
            .checked_add(more)
            .is_some_and(|after| after <= shared.max_bytes);
        if !fits && !alone {
            return false;
        }
        shared.held_bytes.set(held.saturating_add(more));
        self.bytes = total;
        true
    }
}

impl Drop for BodyReservation {
    fn drop(&mut self) {
        let shared = &self.budget.shared;
        shared
            .held_bytes
            .set(shared.held_bytes.get().saturating_sub(self.bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_budget_and_give_it_back() {
        let budget = BodyBudget::new(100);
        let mut a = budget.reservation();
        assert!(a.grow_to(60));
        let mut b = budget.reservation();
        assert!(b.grow_to(40));
        assert!(!b.grow_to(41), "past the budget with another body held");
        assert_eq!(budget.held_bytes(), 100);
        drop(a);
        assert_eq!(budget.held_bytes(), 40);
        // Alone, a body may pass the budget: one body always fits.
        assert!(b.grow_to(1000));
        let mut c = budget.reservation();
        assert!(!c.grow_to(1));
        drop(b);
        assert!(c.grow_to(usize::MAX));
        assert!(c.grow_to(5), "shrinking is a no-op");
        drop(c);
        assert_eq!(budget.held_bytes(), 0);
    }
}
