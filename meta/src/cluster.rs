//! Cluster metadata: node membership and leases, stream ownership with epochs, transfers.
//!
//! Several nodes share one Postgres database (and one bucket). The tables (schema v6):
//!
//! ```text
//! nodes    node_id │ epoch │ address │ ds_address │ slots │ lease_expires_ms │ registered_ms
//!          one row per node id, never deleted; `epoch` is the node's incarnation (only grows);
//!          the lease is on the database clock, so nodes' clocks need not agree
//! streams  … │ owner_node │ owner_epoch │ transfer_to
//!          the owner serves the stream; `owner_epoch` is raised by every change of owner and
//!          fences every write of a previous owner; `transfer_to` is a pending live transfer
//! ```
//!
//! Fencing: every write a cluster node makes for a stream (segment entries, close, trim,
//! touch, delete) names the owner epoch it holds the stream at, and the row is locked and
//! compared in the same transaction (`check_fence` and `commit_fenced` in `fence.rs`). A takeover locks the
//! same rows, so a write and a takeover are ordered: a write after the takeover is refused.
//!
//! Leases: a node renews its row's lease every third of the lease time. A node whose lease
//! lapsed (by the database clock) is dead to the others: the first live node to notice moves
//! its streams to live nodes ([`MetaStore::take_over`]) under a lock on the dead node's row,
//! which its renewal also takes, so a paused node that wakes up either renews first (and
//! nothing moves) or finds its streams gone.

use std::collections::HashMap;

use crate::backend::{Backend, NodeId, NodeRow};
use crate::fence::{load_snapshot_of, node_i64, ownership, sql, Fence, Ownership};
use crate::rows::{storable, stream_row, unsigned};
use crate::MetaError;
use crate::MetaStore;
use crate::Reply;
use crate::Snapshot;
use crate::StreamRow;

/// One stream of a cluster-wide listing, as the catalog has it: the row, its owner, and its
/// offsets as committed (under object durability, every acknowledged append; under local
/// durability, what has been uploaded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogStream {
    pub row: StreamRow,
    pub ownership: Ownership,
    /// First readable offset, as a node loading the stream would compute it.
    pub start_offset: u64,
    /// One past the last committed record.
    pub next_offset: u64,
}

/// A stream of this node that an operator asked to move elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingTransfer {
    pub stream_id: u64,
    pub name: String,
    pub to_node: NodeId,
    /// The owner epoch the stream is held at now.
    pub epoch: u64,
}

/// What a lease renewal (or a registration) reports back: every node and the database clock,
/// and the transfers this node has to carry out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterState {
    pub now_ms: i64,
    pub nodes: Vec<NodeRow>,
    pub transfers: Vec<PendingTransfer>,
    /// Set by [`MetaStore::register_node`]: how much of the previous incarnation's lease was
    /// left (database clock, ms). That incarnation may still run and acknowledge until its
    /// lease lapses, so the new one acknowledges nothing before then.
    pub previous_lease_left_ms: u64,
    /// Set by [`MetaStore::renew_lease`]: the lease had already expired by the database clock
    /// when the renewal landed (it was slow), so other nodes may have taken streams over
    /// meanwhile: the node revalidates what it owns before it acknowledges anything.
    pub renewed_after_lapse: bool,
}

/// An accepted transfer request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferAccepted {
    pub stream_id: u64,
    pub from_node: NodeId,
    pub to_node: NodeId,
}

/// Everything a node needs to start serving one stream it now owns: the row, the catalog
/// entries of the stream (a [`Snapshot`] of one stream), the owner epoch and how many forks
/// read from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamLoad {
    pub snapshot: Snapshot,
    pub ownership: Ownership,
    pub fork_refs: u64,
}

fn state(db: &mut dyn Backend, node: NodeId) -> Result<ClusterState, MetaError> {
    let sql = sql(db)?;
    let now_ms = sql.clock_ms()?;
    let nodes = sql.nodes()?;
    let transfers = sql
        .transfers_of(node_i64(node))?
        .into_iter()
        .map(|(id, name, epoch, to)| PendingTransfer {
            stream_id: id as u64,
            name,
            to_node: to as NodeId,
            epoch: epoch as u64,
        })
        .collect();
    Ok(ClusterState {
        now_ms,
        nodes,
        transfers,
        previous_lease_left_ms: 0,
        renewed_after_lapse: false,
    })
}

/// Highest-random-weight placement: the live node with slots whose weighted score for `key`
/// is highest. Every node computes the same answer from the same view, and a node joining or
/// leaving moves only the keys it wins or held.
pub fn place(key: &str, nodes: &[NodeRow], now_ms: i64) -> Option<NodeId> {
    nodes
        .iter()
        .filter(|n| n.slots > 0 && n.is_live(now_ms))
        .map(|n| {
            let hash = fnv1a(&format!("{}\u{0}{key}", n.id));
            // Weighted rendezvous: -ln(u)/w picks node n with probability w_n / Σw.
            let unit = ((hash >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (-(unit.ln()) / n.slots as f64, n.id)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, id)| id)
}

fn fnv1a(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // FNV leaves the last bytes in the low bits; the placement reads the high ones, so mix
    // (the murmur3 finalizer).
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

impl MetaStore {
    /// Registers this node incarnation (its lease running `lease_ms` from now) and adopts rows
    /// no node owns. Refused when the id already ran at this epoch or a newer one: epochs
    /// fence old incarnations, so they must grow.
    pub fn register_node(
        &self,
        node: NodeId,
        epoch: u64,
        address: &str,
        slots: u64,
        lease_ms: u64,
    ) -> Reply<ClusterState> {
        let address = address.to_string();
        self.job(move |db| {
            let epoch_i = storable(epoch, || "node epoch".into())?;
            let slots_i = storable(slots, || "slots".into())?;
            let lease_i = storable(lease_ms, || "lease".into())?;
            let sql = sql(db)?;
            let mut previous_lease_left_ms = 0;
            if let Some(known) = sql.lock_node(node_i64(node))? {
                if known.epoch >= epoch {
                    return Err(MetaError::Rejected(format!(
                        "node {node} already ran at epoch {}, not older than this one ({epoch}); \
                         --node-epoch must grow with every start",
                        known.epoch
                    )));
                }
                let left = known.lease_expires_ms.saturating_sub(sql.clock_ms()?);
                previous_lease_left_ms = u64::try_from(left).unwrap_or(0);
            }
            sql.upsert_node(node_i64(node), epoch_i, &address, slots_i, lease_i)?;
            let adopted = sql.adopt_unowned(node_i64(node))?;
            if adopted > 0 {
                log::info!("node {node} adopted {adopted} streams that no node owned");
            }
            let mut state = state(db, node)?;
            state.previous_lease_left_ms = previous_lease_left_ms;
            Ok(state)
        })
    }

    /// Extends this node's lease; [`MetaError::Fenced`] when a newer incarnation of the id
    /// registered since.
    pub fn renew_lease(&self, node: NodeId, epoch: u64, lease_ms: u64) -> Reply<ClusterState> {
        self.job(move |db| {
            // Locked first, so a take-over (which locks it too) is ordered with this renewal.
            let known = sql(db)?.lock_node(node_i64(node))?;
            let now_ms = sql(db)?.clock_ms()?;
            let lapsed = known.is_some_and(|row| row.lease_expires_ms <= now_ms);
            let renewed = sql(db)?.renew(
                node_i64(node),
                storable(epoch, || "node epoch".into())?,
                storable(lease_ms, || "lease".into())?,
            )?;
            if !renewed {
                return Err(MetaError::Fenced(format!(
                    "node {node} at epoch {epoch} was superseded by a newer incarnation"
                )));
            }
            let mut state = state(db, node)?;
            state.renewed_after_lapse = lapsed;
            Ok(state)
        })
    }

    /// Publishes this incarnation's advertised addresses, one per protocol (known once its
    /// listeners are bound; empty: no listener of that protocol).
    pub fn advertise(
        &self,
        node: NodeId,
        epoch: u64,
        address: &str,
        ds_address: &str,
    ) -> Reply<ClusterState> {
        let (address, ds_address) = (address.to_string(), ds_address.to_string());
        self.job(move |db| {
            let epoch_i = storable(epoch, || "node epoch".into())?;
            if !sql(db)?.set_address(node_i64(node), epoch_i, &address, &ds_address)? {
                return Err(MetaError::Fenced(format!(
                    "node {node} at epoch {epoch} was superseded by a newer incarnation"
                )));
            }
            state(db, node)
        })
    }

    /// Ends this node's lease now (a clean stop), so others take its streams over at once.
    pub fn release_lease(&self, node: NodeId, epoch: u64) -> Reply<()> {
        self.job(move |db| {
            sql(db)?.release(node_i64(node), storable(epoch, || "node epoch".into())?)
        })
    }

    /// Every node and the database clock.
    pub fn cluster_state(&self, node: NodeId) -> Reply<ClusterState> {
        self.job(move |db| state(db, node))
    }

    /// Moves the streams of `dead` (at incarnation `dead_epoch`) to live nodes, spread by
    /// placement; a fork family (a source and its forks) goes to one node. Nothing moves
    /// unless `dead`'s lease has lapsed and it is still that incarnation. Returns the moved
    /// `(stream id, new owner)` pairs.
    pub fn take_over(&self, dead: NodeId, dead_epoch: u64) -> Reply<Vec<(u64, NodeId)>> {
        self.job(move |db| {
            let sql = sql(db)?;
            let now_ms = sql.clock_ms()?;
            let Some(row) = sql.lock_node(node_i64(dead))? else {
                return Ok(Vec::new());
            };
            if row.epoch != dead_epoch || row.is_live(now_ms) {
                return Ok(Vec::new());
            }
            let nodes = sql.nodes()?;
            let owned = sql.owned_by(node_i64(dead), true)?;
            if owned.is_empty() {
                return Ok(Vec::new());
            }
            let sources: HashMap<i64, Option<i64>> =
                owned.iter().map(|&(id, _, src)| (id, src)).collect();
            let root = |mut id: i64| {
                // Follow fork sources within the dead node's rows (bounded by their count).
                for _ in 0..sources.len() {
                    match sources.get(&id).copied().flatten() {
                        Some(src) if sources.contains_key(&src) => id = src,
                        _ => break,
                    }
                }
                id
            };
            let mut by_target: HashMap<NodeId, Vec<i64>> = HashMap::new();
            for &(id, _, _) in &owned {
                let Some(target) = place(&format!("#{}", root(id)), &nodes, now_ms) else {
                    return Err(MetaError::Rejected(format!(
                        "no live node with slots can take over node {dead}'s streams"
                    )));
                };
                by_target.entry(target).or_default().push(id);
            }
            let mut moved = Vec::new();
            for (target, ids) in by_target {
                sql.reassign(&ids, node_i64(target))?;
                moved.extend(ids.into_iter().map(|id| (id as u64, target)));
            }
            moved.sort_unstable();
            Ok(moved)
        })
    }

    /// The row named `name` and its owner, read in the database now (not a cached view).
    pub fn lookup_stream(&self, name: &str) -> Reply<Option<(StreamRow, Ownership)>> {
        self.lookup(name.to_string())
    }

    /// What a node needs to serve stream `id` that it owns now (after a takeover or a
    /// transfer); `None` when the row is gone.
    pub fn load_stream(&self, id: u64) -> Reply<Option<StreamLoad>> {
        self.job(move |db| {
            let id_i = storable(id, || "stream id".into())?;
            let Some(columns) = sql(db)?.find_id(id_i)? else {
                return Ok(None);
            };
            let owner = ownership(&columns);
            let row = stream_row(columns)?;
            let fork_refs = sql(db)?.fork_count(id_i)?;
            let segments = load_snapshot_of(db, id_i)?;
            Ok(Some(StreamLoad {
                snapshot: Snapshot {
                    streams: vec![row],
                    segments,
                    stream_ids_reached: None,
                    catalog_id: None,
                },
                ownership: owner,
                fork_refs,
            }))
        })
    }

    /// `stream id → owner epoch` of every stream `node` owns.
    pub fn owned_streams(&self, node: NodeId) -> Reply<HashMap<u64, u64>> {
        self.job(move |db| {
            Ok(sql(db)?
                .owned_by(node_i64(node), false)?
                .into_iter()
                .map(|(id, epoch, _)| (id as u64, epoch as u64))
                .collect())
        })
    }

    /// Asks the owner of `name` to hand it to `to_node` (it does so on its next lease round).
    /// The target must be registered with slots and live, the stream owned by another node, and
    /// no other transfer pending; a stream with forks (or a fork) stays with its family.
    pub fn request_transfer(&self, name: &str, to_node: NodeId) -> Reply<TransferAccepted> {
        let name = name.to_string();
        self.job(move |db| {
            let sql = sql(db)?;
            let now_ms = sql.clock_ms()?;
            let Some(columns) = sql.find(&name)? else {
                return Err(MetaError::NotFound(format!("stream {name} not found")));
            };
            let owner = ownership(&columns);
            let id = columns.id;
            let target = sql.nodes()?.into_iter().find(|n| n.id == to_node);
            let Some(target) = target else {
                return Err(MetaError::Rejected(format!(
                    "node {to_node} is not registered"
                )));
            };
            if target.slots == 0 {
                return Err(MetaError::Rejected(format!(
                    "node {to_node} has zero slots"
                )));
            }
            if !target.is_live(now_ms) {
                return Err(MetaError::Rejected(format!(
                    "node {to_node} is not live (its lease lapsed)"
                )));
            }
            let Some(from) = owner.node else {
                return Err(MetaError::Rejected(format!(
                    "stream {name} is not opened on any node"
                )));
            };
            if from == to_node {
                return Err(MetaError::Rejected(format!(
                    "target equals source: stream {name} is already on node {to_node}"
                )));
            }
            if let Some(pending) = owner.transfer_to.filter(|&t| t != to_node) {
                return Err(MetaError::Rejected(format!(
                    "a transfer of {name} to node {pending} is already pending"
                )));
            }
            if columns.fork_source.is_some() || sql.fork_count(id)? > 0 {
                return Err(MetaError::Rejected(format!(
                    "stream {name} has forks or is a fork; a fork family moves only with its node"
                )));
            }
            sql.set_transfer(id, Some(node_i64(to_node)))?;
            Ok(TransferAccepted {
                stream_id: id as u64,
                from_node: from,
                to_node,
            })
        })
    }

    /// Hands stream `id` from `fence` (its owner) to `to_node` at the next epoch, once the
    /// owner stored everything it had of it. The new epoch; [`MetaError::Fenced`] when the row
    /// changed meanwhile.
    pub fn complete_transfer(&self, id: u64, fence: Fence, to_node: NodeId) -> Reply<u64> {
        self.job(move |db| {
            crate::fence::check_fence(db, id, Some(fence))?;
            let moved = sql(db)?.finish_transfer(
                storable(id, || "stream id".into())?,
                node_i64(fence.node),
                storable(fence.epoch, || "epoch".into())?,
                node_i64(to_node),
            )?;
            match moved {
                Some(epoch) => unsigned(Some(epoch), || "owner epoch".into()),
                None => Err(MetaError::Fenced(format!(
                    "stream {id} changed while node {} handed it to node {to_node}",
                    fence.node
                ))),
            }
        })
    }

    /// Drops a pending transfer (its target went away).
    pub fn cancel_transfer(&self, id: u64) -> Reply<()> {
        self.job(move |db| sql(db)?.set_transfer(storable(id, || "stream id".into())?, None))
    }

    /// Sets a registered node's placement weight; its row.
    pub fn set_slots(&self, node: NodeId, slots: u64) -> Reply<NodeRow> {
        self.job(move |db| {
            let sql = sql(db)?;
            if !sql.set_slots(node_i64(node), storable(slots, || "slots".into())?)? {
                return Err(MetaError::NotFound(format!(
                    "node {node} is not registered"
                )));
            }
            sql.nodes()?
                .into_iter()
                .find(|n| n.id == node)
                .ok_or_else(|| MetaError::NotFound(format!("node {node} is not registered")))
        })
    }

    /// Every pending transfer: `(stream id, from node, to node)`.
    pub fn pending_transfers(&self) -> Reply<Vec<(u64, Option<NodeId>, NodeId)>> {
        self.job(move |db| {
            Ok(sql(db)?
                .all_transfers()?
                .into_iter()
                .map(|(id, from, to)| (id as u64, from.map(|n| n as NodeId), to as NodeId))
                .collect())
        })
    }

    /// At most `limit` streams of the whole cluster whose names start with `prefix` and sort
    /// after `start_after` (bytewise), in name order, with their owners and committed offsets;
    /// soft-deleted streams are left out.
    pub fn list_streams(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> Reply<Vec<CatalogStream>> {
        let (prefix, start_after) = (prefix.to_string(), start_after.to_string());
        self.job(move |db| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let sql = sql(db)?;
            let page = sql.page_of_streams(&prefix, &start_after, limit)?;
            let ids: Vec<i64> = page.iter().map(|c| c.id).collect();
            let edges: HashMap<i64, (Vec<u8>, Vec<u8>)> = sql
                .edge_entries(&ids)?
                .into_iter()
                .map(|(id, first, last)| (id, (first, last)))
                .collect();
            page.into_iter()
                .map(|columns| {
                    let ownership = ownership(&columns);
                    let edge = edges.get(&columns.id);
                    let row = stream_row(columns)?;
                    let (start_offset, next_offset) = committed_offsets(&row, edge)?;
                    Ok(CatalogStream {
                        row,
                        ownership,
                        start_offset,
                        next_offset,
                    })
                })
                .collect()
        })
    }

    /// How many streams each node owns (`None`: rows no node owns).
    pub fn owner_counts(&self) -> Reply<Vec<(Option<NodeId>, u64)>> {
        self.job(move |db| {
            Ok(sql(db)?
                .owner_counts()?
                .into_iter()
                .map(|(node, count)| (node.and_then(|n| NodeId::try_from(n).ok()), count))
                .collect())
        })
    }
}

/// A stream's `(start, next)` from its row and the runs of its first and last catalog entries,
/// the way a node loading the stream computes them: the tail is the last run's end (never
/// below the fork point nor the trim point); the start is the trim point, or the first stored
/// record once older segments were collected, never past the tail.
fn committed_offsets(
    row: &StreamRow,
    edge: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<(u64, u64), MetaError> {
    let base = row.fork.as_ref().map_or(0, |f| {
        f.offset.saturating_add(u64::from(f.partial_bytes > 0))
    });
    let corrupt = || MetaError::Storage(format!("unreadable runs of stream {}", row.id));
    let (first_stored, last_next) = match edge {
        None => (base, 0),
        Some((first, last)) => {
            let first = crate::runs::decode(first).ok_or_else(corrupt)?;
            let last = crate::runs::decode(last).ok_or_else(corrupt)?;
            (
                first.iter().map(|r| r.first_offset).min().unwrap_or(base),
                last.iter().map(|r| r.next_offset).max().unwrap_or(0),
            )
        }
    };
    let next = last_next.max(base).max(row.start_offset);
    let first_stored = if base > 0 { 0 } else { first_stored };
    Ok((row.start_offset.max(first_stored).min(next), next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: NodeId, slots: u64, lease_expires_ms: i64) -> NodeRow {
        NodeRow {
            id,
            epoch: 1,
            address: format!("http://n{id}"),
            ds_address: String::new(),
            slots,
            lease_expires_ms,
            registered_ms: 0,
        }
    }

    fn row(start_offset: u64, fork: Option<(u64, u64)>) -> StreamRow {
        StreamRow {
            id: 7,
            name: "/s".into(),
            config: crate::StreamConfig {
                content_type: "text/plain".into(),
                ttl_sec: None,
                expires_at_ms: None,
                retention: Default::default(),
            },
            closed: false,
            created_ms: 0,
            start_offset,
            last_access_ms: 0,
            fork: fork.map(|(offset, partial_bytes)| crate::ForkRow {
                source: "/src".into(),
                source_id: 1,
                offset,
                partial_bytes,
            }),
            soft_deleted: false,
        }
    }

    fn runs(offsets: &[(u64, u64)]) -> Vec<u8> {
        let runs: Vec<crate::SegmentRun> = offsets
            .iter()
            .scan(0, |bytes, &(first_offset, next_offset)| {
                let byte_start = *bytes;
                *bytes += 10 * (next_offset - first_offset);
                Some(crate::SegmentRun {
                    first_offset,
                    next_offset,
                    byte_start,
                    byte_end: *bytes,
                })
            })
            .collect();
        crate::runs::encode(&runs)
    }

    #[test]
    fn committed_offsets_follow_the_first_and_last_entries() {
        // No entry yet: empty at 0, or at the fork point (one past a partly inherited record).
        assert_eq!(committed_offsets(&row(0, None), None).unwrap(), (0, 0));
        assert_eq!(
            committed_offsets(&row(0, Some((5, 0))), None).unwrap(),
            (0, 5)
        );
        assert_eq!(
            committed_offsets(&row(0, Some((5, 3))), None).unwrap(),
            (0, 6)
        );
        // The tail is the last entry's end; the start the trim point.
        let edge = (runs(&[(0, 4)]), runs(&[(9, 12), (12, 20)]));
        assert_eq!(
            committed_offsets(&row(0, None), Some(&edge)).unwrap(),
            (0, 20)
        );
        assert_eq!(
            committed_offsets(&row(15, None), Some(&edge)).unwrap(),
            (15, 20)
        );
        // Older segments collected: the first stored record is the start.
        let collected = (runs(&[(10, 12)]), runs(&[(12, 20)]));
        assert_eq!(
            committed_offsets(&row(3, None), Some(&collected)).unwrap(),
            (10, 20)
        );
        // Trimmed past every stored record (all collected): empty at the trim point.
        assert_eq!(
            committed_offsets(&row(30, None), Some(&collected)).unwrap(),
            (30, 30)
        );
        let garbage = (vec![1, 2, 3], runs(&[(0, 1)]));
        assert!(committed_offsets(&row(0, None), Some(&garbage)).is_err());
    }

    #[test]
    fn placement_skips_dead_and_slotless_nodes_and_follows_weights() {
        let nodes = [
            node(1, 1, 100),
            node(2, 3, 100),
            node(3, 0, 100),
            node(4, 5, 10),
        ];
        let mut counts = HashMap::new();
        for i in 0..4000 {
            let chosen = place(&format!("/s/{i}"), &nodes, 50).unwrap();
            *counts.entry(chosen).or_insert(0) += 1;
        }
        assert!(!counts.contains_key(&3), "zero slots: {counts:?}");
        assert!(!counts.contains_key(&4), "lease lapsed: {counts:?}");
        let (one, two) = (counts[&1] as f64, counts[&2] as f64);
        // Weights 1:3, so node 2 takes about three quarters.
        assert!((0.68..0.82).contains(&(two / (one + two))), "{counts:?}");
        // Stable: the same view gives the same answer.
        assert_eq!(place("/x", &nodes, 50), place("/x", &nodes, 50));
        assert_eq!(place("/x", &[node(3, 0, 100)], 50), None);
    }
}
