//! What the cores and the webhook delivery threads share: the registry behind its lock, the
//! count read without it, the signing key, the state file and the delivery queue.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::keys::SigningKey;
use super::queue::Queue;
use super::registry::Registry;
use super::registry::{Job, Outcome};
use super::store::{Store, StoreError};
use super::DeliveryReport;
use crate::limits::QUEUED_DELIVERIES_MAX;

/// The TLS client settings, built by a delivery thread on its first https delivery (`None`
/// inside: no CA bundle was found).
pub(super) type TlsCache = Option<Option<std::sync::Arc<rustls::ClientConfig>>>;

/// What one delivery does, on a delivery thread.
pub(super) type DeliverFn = fn(&Shared, &Job, &mut TlsCache) -> Outcome;

/// What the cores and the delivery threads share.
pub(super) struct Shared {
    /// The number of subscriptions, read without the lock on every write.
    pub(super) active: AtomicUsize,
    pub(super) registry: RwLock<Registry>,
    pub(super) signing: SigningKey,
    pub(super) sweeper_running: AtomicBool,
    /// The state file; `None` keeps everything in memory.
    pub(super) store: Option<Store>,
    pub(super) deliveries: Queue,
    /// What one delivery does: `delivery::deliver`, or a stand-in in tests.
    pub(super) deliver: DeliverFn,
    /// Whether webhooks may go to loopback hosts (see `webhook_url`).
    pub(super) webhook_loopback: AtomicBool,
    /// This node's listeners, as bound: deliveries never go to them.
    pub(super) own_listeners: RwLock<Vec<std::net::SocketAddr>>,
    /// Results of other services' deliveries (`Subscriptions::deliver_for`), until taken.
    pub(super) reports: Mutex<Vec<DeliveryReport>>,
}

impl Shared {
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the result of another service's delivery until it takes it. Bounded like the
    /// queue: a service that never takes its results loses the oldest, never the node's memory.
    pub(super) fn report(&self, report: DeliveryReport) {
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        if reports.len() >= QUEUED_DELIVERIES_MAX {
            reports.remove(0);
        }
        reports.push(report);
    }

    pub(super) fn webhook_loopback_allowed(&self) -> bool {
        self.webhook_loopback.load(Ordering::Relaxed)
    }

    pub(super) fn own_listeners(&self) -> Vec<std::net::SocketAddr> {
        self.own_listeners
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Whether the state file is behind the registry.
    pub(super) fn dirty(&self) -> bool {
        self.store
            .as_ref()
            .is_some_and(|store| store.behind(self.read().version()))
    }

    /// Brings the state file up to date. Blocks on file I/O: never call it on a core.
    pub(super) fn persist(&self) -> Result<(), StoreError> {
        match &self.store {
            Some(store) => store.save(&self.registry, &self.signing),
            None => Ok(()),
        }
    }
}
