//! Garbage collection of segment objects, run by core 0 for the node: segments that hold
//! only deleted, expired or trimmed-away data are deleted from the object store, then from
//! the catalog (in that order, so a crash in between leaves a row to find again, never an
//! object nobody knows of). A backup holds the collector ([`GcGate`]) while it copies the
//! objects its catalog copy names.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use pico_meta::MetaError;
use pico_s3::StoreError;

use crate::clock::Clock;
use crate::inbox::Message;
use crate::limits;
use crate::route::Router;

/// Whether the collector may run a round: core 0's collector and whoever holds it (a
/// backup, served by core 0's admin listener) share it on that core's thread.
#[derive(Default)]
pub(crate) struct GcGate {
    /// Where a hold's deadline is read.
    clock: Clock,
    /// Holds taken and not yet dropped; no round starts while any is.
    holds: Cell<usize>,
    /// A round is deleting objects and rows now.
    round_running: Cell<bool>,
}

/// While alive, the collector deletes nothing: no round starts, and the hold was given only
/// once a round in progress had ended (so no object named by a catalog read after that is
/// deleted). Dropped, the collector resumes at its next interval.
pub struct GcHold {
    gate: Rc<GcGate>,
}

impl Drop for GcHold {
    fn drop(&mut self) {
        self.gate.holds.set(self.gate.holds.get().saturating_sub(1));
    }
}

/// Why a backup did not get the collector's hold ([`crate::CoreHandle::hold_gc`]).
#[derive(Debug)]
pub enum HoldError {
    /// Asked of a core other than 0, which does not run the collector.
    NotCollectorCore,
    /// A round in progress did not end within the timeout.
    RoundRunning { timeout_ms: u128 },
}

impl std::fmt::Display for HoldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HoldError::NotCollectorCore => f.write_str("only core 0 holds the garbage collector"),
            HoldError::RoundRunning { timeout_ms } => write!(
                f,
                "the garbage collector's round did not end within {timeout_ms} ms (an object \
                 store or catalog outage?)"
            ),
        }
    }
}

impl std::error::Error for HoldError {}

/// Why a collection round stopped (logged; the next round starts over).
#[derive(Debug)]
enum RoundError {
    MetaStopped,
    Meta(MetaError),
    StoreStopped,
    Delete { key: String, source: StoreError },
}

impl std::fmt::Display for RoundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RoundError::MetaStopped => f.write_str("metadata store stopped"),
            RoundError::Meta(e) => e.fmt(f),
            RoundError::StoreStopped => f.write_str("object store stopped"),
            RoundError::Delete { key, source } => write!(f, "deleting {key}: {source}"),
        }
    }
}

impl GcGate {
    pub(crate) fn new(clock: Clock) -> GcGate {
        GcGate {
            clock,
            ..GcGate::default()
        }
    }

    /// Holds the collector, once a round in progress ended; `None` if it had not by
    /// `deadline` (a round stuck on an object store or catalog outage), and then no hold.
    pub(crate) async fn hold(self: &Rc<Self>, timeout: Duration) -> Option<GcHold> {
        let deadline = self.clock.now() + timeout;
        // Counted first, so no new round starts while this waits.
        self.holds.set(self.holds.get() + 1);
        let hold = GcHold { gate: self.clone() };
        while self.round_running.get() {
            if self.clock.now() >= deadline {
                return None;
            }
            glommio::timer::sleep(Duration::from_millis(limits::GC_HOLD_POLL_MS)).await;
        }
        Some(hold)
    }

    pub(crate) fn is_held(&self) -> bool {
        self.holds.get() > 0
    }
}

/// Collects every `gc_interval_ms`, for the life of the core, unless held.
pub(crate) async fn gc_loop(router: Rc<Router>, gate: Rc<GcGate>) {
    // At least `limits::GC_INTERVAL_MS_MIN`: `EngineConfig::check` refused a shorter one.
    let interval = Duration::from_millis(router.shard.config().gc_interval_ms);
    loop {
        glommio::timer::sleep(interval).await;
        if gate.is_held() {
            continue;
        }
        gate.round_running.set(true);
        let collected = collect_garbage(&router).await;
        gate.round_running.set(false);
        match collected {
            Ok(0) => {}
            Ok(count) => log::info!("garbage collection removed {count} segments"),
            Err(e) => log::warn!("garbage collection: {e}"),
        }
    }
}

async fn collect_garbage(router: &Router) -> Result<usize, RoundError> {
    // Which streams need a segment is the catalog's to say (a trim reaches it right after the
    // owning core), so a round's work and memory grow with the garbage, not with the streams
    // the cores hold.
    let sealed_before_ms = router.shard.clock().now_ms() - limits::GC_SEALED_MARGIN_MS;
    let (meta, store) = (router.shard.meta(), router.shard.store());
    let keys = meta
        .garbage_segments(sealed_before_ms)
        .await
        .map_err(|_| RoundError::MetaStopped)?
        .map_err(RoundError::Meta)?;
    if keys.is_empty() {
        return Ok(0);
    }
    for key in &keys {
        match store.delete(key).await {
            Ok(Ok(())) | Ok(Err(pico_s3::StoreError::NotFound(_))) => {}
            Ok(Err(source)) => {
                return Err(RoundError::Delete {
                    key: key.clone(),
                    source,
                })
            }
            Err(_) => return Err(RoundError::StoreStopped),
        }
    }
    meta.drop_segments(keys.clone())
        .await
        .map_err(|_| RoundError::MetaStopped)?
        .map_err(RoundError::Meta)?;
    router.shard.count_collected(keys.len());
    let keys = Arc::new(keys);
    router.shard.forget_segments(&keys);
    for core in router.others() {
        let _ = router
            .peers
            .send(core, Message::Forget { keys: keys.clone() });
    }
    Ok(keys.len())
}
