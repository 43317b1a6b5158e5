//! Fencing of cluster writes, on any [`Backend`]: every write a node makes for a stream names
//! the owner epoch it holds the stream at, and the row is locked and compared in the same
//! transaction ([`check_fence`], [`commit_fenced`]). `cluster.rs` says how leases and takeovers
//! use it; `apply.rs` (and `store.rs`, for fenced segment commits) calls it for every fenced
//! write.

use std::collections::{HashMap, HashSet};

use crate::backend::{Backend, ClusterSql, NodeId, StreamColumns};
use crate::rows::{segment_entry, unsigned};
use crate::{MetaError, SegmentRecord, SegmentStreamEntry};

/// Who may write a stream: its owner node, as the incarnation registered now (`node_epoch`,
/// the node's `--node-epoch`), at the owner epoch it holds the stream at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub node: NodeId,
    pub node_epoch: u64,
    pub epoch: u64,
}

/// The owner part of a registry row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ownership {
    /// `None`: a single node's row (no cluster), or a row no node claimed yet.
    pub node: Option<NodeId>,
    pub epoch: u64,
    /// A live transfer asked for and not done yet.
    pub transfer_to: Option<NodeId>,
}

/// The fence of a segment commit: entries of streams `node` does not own are left out; for
/// the ids in `epochs` the owner epoch must match too. Every entry is left out when `node`
/// is registered at another incarnation than `node_epoch` (a replacement started with the
/// same id, while this one still runs or was frozen).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFence {
    pub node: NodeId,
    pub node_epoch: u64,
    pub epochs: HashMap<u64, u64>,
    /// The refused entries hold acknowledged records (local durability, or a WAL's
    /// recovery): each is kept in the quarantine with its reason, and the garbage collector
    /// keeps the segment, until an operator releases it. With object durability nothing
    /// refused was acknowledged, and nothing is kept.
    pub quarantine_refused: bool,
}

/// Refuses a write by a node incarnation that a newer one superseded (or that was never
/// registered). The node's row is share-locked until the transaction ends, so a registration
/// of a newer incarnation is ordered with this write: before it, or after and refused.
fn check_incarnation(db: &mut dyn Backend, node: NodeId, node_epoch: u64) -> Result<(), MetaError> {
    let registered = sql(db)?.node_epoch(node_i64(node))?;
    if registered.is_some_and(|epoch| i64::try_from(node_epoch) == Ok(epoch)) {
        return Ok(());
    }
    Err(MetaError::Fenced(format!(
        "node {node} at epoch {node_epoch} was superseded by a newer incarnation ({})",
        registered.map_or("none registered".to_string(), |e| format!("epoch {e}"))
    )))
}

/// The committed segments holding stream `id`, each with only that stream's entry.
pub(crate) fn load_snapshot_of(
    db: &mut dyn Backend,
    id: i64,
) -> Result<Vec<SegmentRecord>, MetaError> {
    sql(db)?
        .entries_of(id)?
        .into_iter()
        .map(|(segment, entry)| {
            let key = segment.key;
            let size_bytes = unsigned(Some(segment.size_bytes), || format!("segment {key}: size"))?;
            let entry = segment_entry(&key, Ok(entry))?;
            Ok(SegmentRecord {
                key,
                size_bytes,
                created_ms: segment.created_ms,
                streams: vec![entry],
            })
        })
        .collect()
}

pub(crate) fn ownership(columns: &StreamColumns) -> Ownership {
    Ownership {
        node: columns.owner_node.and_then(|n| NodeId::try_from(n).ok()),
        epoch: u64::try_from(columns.owner_epoch).unwrap_or(0),
        transfer_to: columns.transfer_to.and_then(|n| NodeId::try_from(n).ok()),
    }
}

pub(crate) fn sql(db: &mut dyn Backend) -> Result<&mut dyn ClusterSql, MetaError> {
    db.cluster().ok_or_else(|| {
        MetaError::Unsupported(
            "a cluster needs a shared metadata database: use --meta-url postgres://…".into(),
        )
    })
}

/// Refuses a write to stream `id` by an owner that is not (or no longer) the row's.
pub(crate) fn check_fence(
    db: &mut dyn Backend,
    id: u64,
    fence: Option<Fence>,
) -> Result<(), MetaError> {
    let Some(fence) = fence else {
        return Ok(());
    };
    check_incarnation(db, fence.node, fence.node_epoch)?;
    let Ok(id) = i64::try_from(id) else {
        return Ok(()); // no such row
    };
    let owners = sql(db)?.owners(&[id])?;
    match owners.first() {
        None => Ok(()), // gone: the write has nothing left to change
        Some(&(_, node, epoch)) => {
            fenced_unless_owner(id, node, epoch, fence.node, Some(fence.epoch))
        }
    }
}

fn fenced_unless_owner(
    id: i64,
    node: Option<i64>,
    epoch: i64,
    writer: NodeId,
    writer_epoch: Option<u64>,
) -> Result<(), MetaError> {
    let node_ok = node == Some(i64::from(writer));
    let epoch_ok = writer_epoch.is_none_or(|e| i64::try_from(e) == Ok(epoch));
    if node_ok && epoch_ok {
        return Ok(());
    }
    let owner = node.map_or("no node".to_string(), |n| format!("node {n}"));
    Err(MetaError::Fenced(format!(
        "stream {id} is owned by {owner} at epoch {epoch}, not by node {writer}{}",
        writer_epoch.map_or(String::new(), |e| format!(" at epoch {e}"))
    )))
}

/// A segment commit leaving out the entries of streams the committing node lost.
pub(crate) fn commit_fenced(
    db: &mut dyn Backend,
    mut segment: SegmentRecord,
    fence: &SegmentFence,
) -> Result<Vec<u64>, MetaError> {
    let mut ids: Vec<i64> = segment
        .streams
        .iter()
        .filter_map(|e| i64::try_from(e.stream_id).ok())
        .collect();
    ids.sort_unstable();
    let superseded = check_incarnation(db, fence.node, fence.node_epoch).err();
    let owners: HashMap<i64, (Option<i64>, i64)> = sql(db)?
        .owners(&ids)?
        .into_iter()
        .map(|(id, node, epoch)| (id, (node, epoch)))
        .collect();
    // Why an entry is refused, or `None` when it is this writer's to commit.
    let refused = |entry: &SegmentStreamEntry| -> Option<String> {
        if let Some(superseded) = &superseded {
            return Some(superseded.to_string());
        }
        let id = entry.stream_id as i64;
        // A deleted row takes no records: committing them would acknowledge appends to a
        // stream that no longer exists (a delete whose answer was lost leaves the writer's
        // core serving it), which the garbage collector then removes.
        let Some(&(node, epoch)) = owners.get(&id) else {
            return Some(format!("stream {id} was deleted"));
        };
        let expected = fence.epochs.get(&entry.stream_id).copied();
        fenced_unless_owner(id, node, epoch, fence.node, expected)
            .err()
            .map(|e| e.to_string())
    };
    let mut reasons: HashMap<u64, String> = segment
        .streams
        .iter()
        .filter_map(|entry| Some((entry.stream_id, refused(entry)?)))
        .collect();
    for (id, overlap) in overlaps(db, &segment)? {
        reasons.entry(id).or_insert(overlap);
    }
    let mut fenced: Vec<u64> = segment
        .streams
        .iter()
        .filter(|entry| reasons.contains_key(&entry.stream_id))
        .map(|entry| entry.stream_id)
        .collect();
    if !fenced.is_empty() {
        // A retry of a commit whose answer was lost (the connection dropped at COMMIT, which
        // may have succeeded): what that attempt committed under the fence stays, even if the
        // stream has moved since. The new owner may have loaded those records and appended
        // after them; dropping the entries now would leave a hole in its offsets (the fault
        // test's cluster profile checks it). Those appends are stored, so they are not fenced.
        // Asked only when something would be fenced: the common commit pays no extra query.
        let committed: HashSet<i64> = sql(db)?
            .committed_streams(&segment.key)?
            .into_iter()
            .collect();
        fenced.retain(|id| !committed.contains(&(*id as i64)));
    }
    if fence.quarantine_refused {
        let now_ms = sql(db)?.clock_ms()?;
        for entry in segment
            .streams
            .iter()
            .filter(|e| fenced.contains(&e.stream_id))
        {
            let reason = reasons.remove(&entry.stream_id).unwrap_or_default();
            let runs = crate::runs::encode(&entry.runs);
            db.quarantine(&segment.key, entry.stream_id as i64, &runs, &reason, now_ms)?;
        }
    }
    segment
        .streams
        .retain(|entry| !fenced.contains(&entry.stream_id));
    crate::rows::commit(db, &segment)?;
    Ok(fenced)
}

/// The entries of `segment` whose records begin below the end of what the catalog already
/// holds of their stream (its newest entry in another segment), each with why. Offsets are
/// handed out once, so a writer whose view of a stream was stale (a bug, or a fault no fence
/// caught) would commit a second record at an offset already committed, and a restart would
/// serve one of them in place of the other: that entry is refused like a fenced one (its
/// appends fail, or are quarantined with local durability) and said loudly. A commit of the
/// same key again (a retry after a lost answer) is measured against the others.
fn overlaps(
    db: &mut dyn Backend,
    segment: &SegmentRecord,
) -> Result<Vec<(u64, String)>, MetaError> {
    let firsts: HashMap<i64, u64> = segment
        .streams
        .iter()
        .filter_map(|entry| {
            let first = entry.runs.iter().map(|run| run.first_offset).min()?;
            Some((i64::try_from(entry.stream_id).ok()?, first))
        })
        .collect();
    let ids: Vec<i64> = firsts.keys().copied().collect();
    let mut found = Vec::new();
    for (id, key, runs) in sql(db)?.newest_entries(&ids, &segment.key)? {
        let runs = crate::runs::decode(&runs).ok_or_else(|| {
            MetaError::Storage(format!("segment {key}: stream {id}: damaged runs"))
        })?;
        let committed_end = runs.iter().map(|run| run.next_offset).max().unwrap_or(0);
        let Some(&first) = firsts.get(&id) else {
            continue;
        };
        if first < committed_end {
            let why = format!(
                "stream {id}: segment {}'s records from offset {first} overlap segment {key}'s, \
                 committed to offset {committed_end}",
                segment.key
            );
            log::error!("segment commit refused for {why}");
            found.push((id as u64, why));
        }
    }
    Ok(found)
}

pub(crate) fn node_i64(node: NodeId) -> i64 {
    i64::from(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_errors_name_both_owners() {
        let error = fenced_unless_owner(7, Some(2), 3, 1, Some(2)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "stream 7 is owned by node 2 at epoch 3, not by node 1 at epoch 2"
        );
        assert!(fenced_unless_owner(7, Some(1), 3, 1, Some(3)).is_ok());
        assert!(fenced_unless_owner(7, Some(1), 3, 1, None).is_ok());
        assert!(fenced_unless_owner(7, None, 1, 1, None).is_err());
    }
}
