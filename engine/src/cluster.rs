//! This node's part in a cluster: its lease, its view of the other nodes, and the keeper
//! thread that renews the lease, takes over the streams of nodes whose lease lapsed and
//! starts the transfers operators ask for.
//!
//! ```text
//!  keeper thread (plain, blocking on the metadata thread)        cores (glommio)
//!  every lease/3:  renew lease ──▶ view (nodes, db clock) ──▶  read on a miss: who owns it?
//!                  lapsed nodes ──▶ take_over (to live nodes)   Op on a stream we lost ─▶ 307
//!                  transfers of ours ──▶ Message::HandOff ──────▶ owning core: flush, hand off
//!  lease lapsed locally (paused, partitioned): renew, then
//!                  owned streams ──▶ Message::Revalidate ───────▶ cores drop what moved
//! ```
//!
//! The lease is judged twice. The database decides who is dead (its clock, `lease_ms` after
//! the last renewal). This node decides when to stop serving on its own clock: a renewal sent
//! at `t` makes the node valid until `t + lease_ms * 3/4`, which is before the database can
//! expire it, so a node that stops hearing from the database stops acknowledging before any
//! other node can take its streams.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_channel::mpsc;
use pico_meta::{ClusterState, MetaError, MetaStore, NodeId, NodeRow};

use crate::clock::Clock;
use crate::error::{EngineError, NotOwnerReason};
use crate::inbox::Message;
use crate::limits;
use crate::placement::owner_core;

/// `pico serve`'s cluster settings.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub node_id: NodeId,
    /// This incarnation's fencing token (`--node-epoch`); must grow across restarts.
    pub node_epoch: u64,
    /// The advertised base URL, verbatim in `307` locations.
    pub address: String,
    pub slots: u64,
    /// A node that has not renewed for this long is dead to the others.
    pub lease_ms: u64,
    /// `--routing redirect` (the default): requests for other nodes' streams get `307`;
    /// `local` serves what this node owns and answers `503` for the rest (a proxy routes).
    pub redirect: bool,
    /// `--cluster-id`, reported by the admin API.
    pub cluster_id: String,
}

/// Shared by the cores and the keeper thread. Only atomics are read on the hot path.
pub struct Cluster {
    pub config: ClusterConfig,
    /// The last view of the nodes (replaced by each renewal; read on misses only).
    view: Mutex<Arc<ClusterState>>,
    /// This node may serve until this many ms after `base` (its own clock).
    valid_until_ms: AtomicU64,
    base: Instant,
    /// Where the lease's own time is read.
    clock: Clock,
    /// A newer incarnation of this node id registered: this process must not serve again.
    superseded: AtomicBool,
    stopping: AtomicBool,
}

impl ClusterConfig {
    /// The engine's rules for a cluster member's settings, checked by [`crate::boot`].
    pub fn check(&self) -> Result<(), limits::SettingError> {
        limits::at_least("lease_ms (--lease-ms)", self.lease_ms, limits::LEASE_MS_MIN)
    }
}

impl Cluster {
    pub fn new(config: ClusterConfig, state: ClusterState, clock: Clock) -> Arc<Cluster> {
        let now = clock.now();
        let cluster = Arc::new(Cluster {
            view: Mutex::new(Arc::new(state)),
            valid_until_ms: AtomicU64::new(0),
            base: now,
            clock,
            superseded: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            config,
        });
        // Registration just renewed the lease.
        cluster.extend_lease(now);
        cluster
    }

    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    /// This incarnation (`--node-epoch`): every fenced write names it.
    pub fn node_epoch(&self) -> u64 {
        self.config.node_epoch
    }

    fn now_ms(&self) -> u64 {
        self.clock
            .now()
            .saturating_duration_since(self.base)
            .as_millis() as u64
    }

    fn extend_lease(&self, sent: Instant) {
        let until =
            sent.duration_since(self.base).as_millis() as u64 + self.config.lease_ms * 3 / 4;
        self.valid_until_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// This node holds its lease now (by its own clock).
    pub fn lease_valid(&self) -> bool {
        !self.superseded.load(Ordering::Acquire)
            && self.now_ms() < self.valid_until_ms.load(Ordering::Acquire)
    }

    /// Waits (bounded by one lease time) for the lease to be valid again; the error for a
    /// request that cannot be served meanwhile.
    pub async fn wait_for_lease(&self) -> Result<(), EngineError> {
        let deadline = self.clock.now() + Duration::from_millis(self.config.lease_ms);
        loop {
            if self.lease_valid() {
                return Ok(());
            }
            if self.superseded.load(Ordering::Acquire) || self.clock.now() >= deadline {
                return Err(EngineError::NotOwner(NotOwnerReason::NoLease {
                    node: self.config.node_id,
                }));
            }
            glommio::timer::sleep(Duration::from_millis(limits::LEASE_WAIT_POLL_MS)).await;
        }
    }

    pub fn view(&self) -> Arc<ClusterState> {
        match self.view.lock() {
            Ok(view) => view.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_view(&self, state: ClusterState) {
        let state = Arc::new(state);
        match self.view.lock() {
            Ok(mut view) => *view = state,
            Err(poisoned) => *poisoned.into_inner() = state,
        }
    }

    /// The node's row in the current view, if it is live.
    pub fn live_node(&self, node: NodeId) -> Option<NodeRow> {
        let view = self.view();
        // The view's clock plus the time since: a lease that lapsed since the last renewal
        // counts as lapsed (a view is at most a third of a lease old).
        view.nodes
            .iter()
            .find(|n| n.id == node && (n.id == self.config.node_id || n.is_live(view.now_ms)))
            .cloned()
    }

    /// Where a new stream named `name` goes (placement by slots among live nodes).
    pub fn place(&self, name: &str) -> Option<NodeId> {
        let view = self.view();
        pico_meta::place(name, &view.nodes, view.now_ms)
    }

    /// The error that sends a client to `node`'s address (or asks it to retry while the
    /// address is not known, or under `--routing local`).
    pub fn moved(&self, node: NodeId) -> EngineError {
        match self.live_node(node) {
            Some(row)
                if self.config.redirect
                    && !(row.address.is_empty() && row.ds_address.is_empty()) =>
            {
                EngineError::Moved {
                    node,
                    address: row.address.trim_end_matches('/').to_string(),
                    ds_address: row.ds_address.trim_end_matches('/').to_string(),
                }
            }
            _ if !self.config.redirect => {
                EngineError::NotOwner(NotOwnerReason::LocalRouting { node })
            }
            _ => EngineError::NotOwner(NotOwnerReason::OwnerUnreachable { node }),
        }
    }

    /// Publishes the advertised address once the listener is bound (`http://{listen}` by
    /// default, known only then when the port was 0). Blocking.
    pub fn advertise(
        &self,
        meta: &MetaStore,
        address: &str,
        ds_address: &str,
    ) -> Result<(), AdvertiseError> {
        let state = wait(meta.advertise(
            self.config.node_id,
            self.config.node_epoch,
            address,
            ds_address,
        ))
        .map_err(|source| AdvertiseError {
            address: address.to_string(),
            source,
        })?;
        self.set_view(state);
        Ok(())
    }

    /// This node's advertised addresses (Pico, Durable Streams), as registered.
    pub fn addresses(&self) -> (String, String) {
        self.view()
            .nodes
            .iter()
            .find(|n| n.id == self.config.node_id)
            .map_or_else(
                || (self.config.address.clone(), String::new()),
                |n| (n.address.clone(), n.ds_address.clone()),
            )
    }

    /// [`Cluster::moved`] for a row's owner, which may be none yet.
    pub fn moved_to(&self, owner: Option<NodeId>) -> EngineError {
        match owner {
            Some(node) => self.moved(node),
            None => EngineError::NotOwner(NotOwnerReason::NoOwnerYet),
        }
    }

    /// Stops renewing the lease (a node shutting down).
    pub fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Ends the lease now, after a clean stop stored everything: the others take this node's
    /// streams over at once instead of after the lease time. Blocking.
    pub fn release(&self, meta: &MetaStore) {
        self.begin_shutdown();
        match wait(meta.release_lease(self.config.node_id, self.config.node_epoch)) {
            Ok(()) => log::info!("released the cluster lease of node {}", self.config.node_id),
            Err(e) => log::warn!("could not release the cluster lease: {e}"),
        }
    }
}

/// Starts the keeper thread; `cores` are the inboxes of the cores (for hand-offs and
/// revalidation).
pub(crate) fn start_keeper(
    cluster: Arc<Cluster>,
    meta: MetaStore,
    cores: Vec<mpsc::Sender<Message>>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("pico-lease".into())
        .spawn(move || keeper(cluster, meta, cores))
        .expect("spawn the lease keeper thread")
}

/// The metadata log refused or failed to publish this node's address.
#[derive(Debug)]
pub struct AdvertiseError {
    pub address: String,
    pub source: MetaError,
}

impl std::fmt::Display for AdvertiseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot advertise {}: {}", self.address, self.source)
    }
}

impl std::error::Error for AdvertiseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn wait<T>(reply: pico_meta::Reply<T>) -> Result<T, MetaError> {
    futures_lite::future::block_on(reply).unwrap_or(Err(MetaError::Closed))
}

fn keeper(cluster: Arc<Cluster>, meta: MetaStore, mut cores: Vec<mpsc::Sender<Message>>) {
    let config = cluster.config.clone();
    // A third of at least `limits::LEASE_MS_MIN` (`ClusterConfig::check`).
    let round = Duration::from_millis(config.lease_ms / 3);
    // Transfers already handed to a core and not settled: not sent again.
    let mut handing: std::collections::HashSet<u64> = Default::default();
    loop {
        if cluster.stopping.load(Ordering::Acquire) {
            return; // `Cluster::release` ends the lease once the cores flushed.
        }
        let lapsed = !cluster.lease_valid();
        let sent = cluster.clock.now();
        match wait(meta.renew_lease(config.node_id, config.node_epoch, config.lease_ms)) {
            Ok(state) => {
                // Lapsed by this node's clock, or by the database's when a slow renewal landed
                // after the lease expired there (other nodes may have taken streams over in
                // between, while this node still thought itself valid).
                if lapsed || state.renewed_after_lapse {
                    // Streams may have moved while we were away: drop those before serving.
                    match wait(meta.owned_streams(config.node_id)) {
                        Ok(owned) => {
                            log::warn!(
                                "node {}: the cluster lease had lapsed; revalidated {} owned \
                                 streams",
                                config.node_id,
                                owned.len()
                            );
                            let owned = Arc::new(owned);
                            let mut answers = Vec::new();
                            let mut undelivered = 0;
                            for core in cores.iter_mut() {
                                let (reply, answer) = futures_channel::oneshot::channel();
                                let message = Message::Revalidate {
                                    owned: owned.clone(),
                                    reply,
                                };
                                if core.try_send(message).is_ok() {
                                    answers.push(answer);
                                } else {
                                    undelivered += 1;
                                }
                            }
                            let mut answered = true;
                            for answer in answers {
                                answered &= futures_lite::future::block_on(answer).is_ok();
                            }
                            // A core that did not revalidate (its inbox was full) may still
                            // serve streams that moved: the lease stays lapsed, so nothing is
                            // acknowledged, and the next round tries again.
                            if undelivered > 0 || !answered {
                                log::warn!(
                                    "node {}: {undelivered} cores could not be asked to \
                                     revalidate; the lease stays lapsed until they are",
                                    config.node_id
                                );
                                std::thread::sleep(round);
                                continue;
                            }
                        }
                        Err(e) => {
                            log::warn!("node {}: cannot revalidate: {e}", config.node_id);
                            std::thread::sleep(round);
                            continue;
                        }
                    }
                }
                cluster.extend_lease(sent);
                let now_ms = state.now_ms;
                let dead: Vec<(NodeId, u64)> = state
                    .nodes
                    .iter()
                    .filter(|n| n.id != config.node_id && !n.is_live(now_ms))
                    .map(|n| (n.id, n.epoch))
                    .collect();
                let transfers = state.transfers.clone();
                cluster.set_view(state);
                for (node, epoch) in dead {
                    match wait(meta.take_over(node, epoch)) {
                        Ok(moved) if !moved.is_empty() => log::warn!(
                            "node {node} stopped renewing its lease: {} of its streams moved \
                             to live nodes ({}) at new owner epochs; everything it stored is \
                             served (with --durability object that is everything it \
                             acknowledged; with local durability, appends it acknowledged after \
                             its last upload stay in its WAL, and it reports them if it restarts)",
                            moved.len(),
                            summarize(&moved)
                        ),
                        Ok(_) => {}
                        Err(e) => log::warn!("taking over node {node}'s streams: {e}"),
                    }
                }
                handing.retain(|id| transfers.iter().any(|t| t.stream_id == *id));
                for transfer in transfers {
                    if handing.contains(&transfer.stream_id) {
                        continue;
                    }
                    if cluster.live_node(transfer.to_node).is_none() {
                        log::warn!(
                            "transfer of {} to node {}: the target is not live; cancelled",
                            transfer.name,
                            transfer.to_node
                        );
                        let _ = wait(meta.cancel_transfer(transfer.stream_id));
                        continue;
                    }
                    let core = owner_core(&transfer.name, cores.len());
                    let (reply, _answer) = futures_channel::oneshot::channel();
                    let message = Message::HandOff {
                        transfer: transfer.clone(),
                        reply,
                    };
                    if cores[core].try_send(message).is_ok() {
                        handing.insert(transfer.stream_id);
                    }
                }
            }
            Err(MetaError::Fenced(message)) => {
                log::error!("{message}: this process stops serving streams");
                cluster.superseded.store(true, Ordering::Release);
                return;
            }
            Err(e) => log::warn!(
                "node {}: cannot renew the cluster lease: {e}",
                config.node_id
            ),
        }
        let spent = sent.elapsed();
        std::thread::sleep(round.saturating_sub(spent));
    }
}

fn summarize(moved: &[(u64, NodeId)]) -> String {
    let mut per_node: std::collections::BTreeMap<NodeId, usize> = Default::default();
    for (_, node) in moved {
        *per_node.entry(*node).or_default() += 1;
    }
    per_node
        .iter()
        .map(|(node, count)| format!("{count} to node {node}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lease_ms: u64) -> ClusterConfig {
        ClusterConfig {
            node_id: 1,
            node_epoch: 1,
            address: String::new(),
            slots: 1,
            lease_ms,
            redirect: true,
            cluster_id: String::new(),
        }
    }

    #[test]
    fn a_lease_below_its_floor_is_refused_not_raised() {
        assert_eq!(config(limits::LEASE_MS_MIN).check(), Ok(()));
        assert_eq!(
            config(limits::LEASE_MS_MIN - 1)
                .check()
                .unwrap_err()
                .to_string(),
            format!(
                "lease_ms (--lease-ms) must be at least {}, got {}",
                limits::LEASE_MS_MIN,
                limits::LEASE_MS_MIN - 1
            )
        );
    }

    /// The lease is judged by the node's clock: a simulated one lapses it when moved past
    /// three quarters of the lease, with no time passing.
    #[test]
    fn the_lease_lapses_by_the_nodes_clock() {
        let clock = Clock::simulated(1_700_000_000_000);
        let cluster = Cluster::new(config(4_000), ClusterState::default(), clock.clone());
        assert!(cluster.lease_valid(), "registration renewed it");
        clock.advance(Duration::from_millis(2_999));
        assert!(cluster.lease_valid());
        clock.advance(Duration::from_millis(1));
        assert!(!cluster.lease_valid(), "3/4 of the lease went by");
        cluster.extend_lease(clock.now());
        assert!(cluster.lease_valid(), "a renewal sent now extends it");
    }
}
