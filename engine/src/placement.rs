//! Where things go: which core owns a stream, and the object key a WAL file's segment is
//! stored under. Pure functions of their arguments; both are persisted behaviour (a change
//! moves streams between cores, or loses the link from a WAL file to its segment).

/// FNV-1a, 64 bit: stable across builds and platforms (unlike `DefaultHasher`).
pub fn stream_hash(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The core that owns `name` among `cores`: `fnv1a64(name) % cores`, so a name maps to the
/// same core across restarts with the same core count (recovery redistributes when the count
/// changes).
pub fn owner_core(name: &str, cores: usize) -> usize {
    (stream_hash(name) % cores as u64) as usize
}

/// The object key of the segment whose WAL file is `<stem>.wal`, under the id of the catalog
/// that names it: catalogs sharing a bucket never write one key, even when two of their nodes
/// took the same millisecond as their run's epoch.
///
/// ```text
/// segments/c<catalog id>/<epoch ms:016>-<core:03>-<counter:010>.seg              single node
/// segments/c<catalog id>/n<node id>/<epoch ms:016>-<core:03>-<counter:010>.seg   with --node-id
/// segments/[n<node id>/]<stem>.seg   a catalog without an id, and every segment stored before
///                                    schema 15 (rows hold whole keys: they read as they are)
/// ```
pub(crate) fn segment_key(catalog_id: Option<&str>, node_id: Option<u32>, stem: &str) -> String {
    let catalog = catalog_id.map(|id| format!("c{id}/")).unwrap_or_default();
    let node = node_id.map(|id| format!("n{id}/")).unwrap_or_default();
    format!("segments/{catalog}{node}{stem}.seg")
}

/// The keys a segment of `stem` may have been stored under: [`segment_key`]'s, then, for a
/// catalog with an id, the one a build before schema 15 gave it (a WAL file of that build's
/// run, recovered by this one).
pub(crate) fn segment_keys(
    catalog_id: Option<&str>,
    node_id: Option<u32>,
    stem: &str,
) -> Vec<String> {
    let mut keys = vec![segment_key(catalog_id, node_id, stem)];
    if catalog_id.is_some() {
        keys.push(segment_key(None, node_id, stem));
    }
    keys
}

/// The node epoch (ms) a WAL file or segment stem starts with (`<epoch>-<core>-<counter>`).
pub(crate) fn epoch_of(stem: &str) -> Option<u64> {
    stem.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_is_stable() {
        // Persisted behaviour: changing the hash moves streams between cores.
        assert_eq!(stream_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stream_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(owner_core("/streams/orders", 1), 0);
    }

    #[test]
    fn owners_spread_over_cores_and_stay_in_range() {
        for cores in 1..=8 {
            let mut seen = vec![0usize; cores];
            for i in 0..1000 {
                let core = owner_core(&format!("/s/{i}"), cores);
                assert!(core < cores);
                seen[core] += 1;
            }
            // Every core gets a fair share (FNV spreads sequential names well).
            assert!(
                seen.iter().all(|&n| n > 1000 / cores / 2),
                "{cores}: {seen:?}"
            );
        }
        // Same name, same core, whatever else was hashed before.
        assert_eq!(owner_core("/x", 7), owner_core("/x", 7));
    }

    #[test]
    fn segment_keys_follow_the_wal_stem() {
        let stem = "0000001700000000-002-0000000042";
        assert_eq!(
            segment_key(None, None, stem),
            "segments/0000001700000000-002-0000000042.seg"
        );
        assert_eq!(
            segment_key(None, Some(3), stem),
            "segments/n3/0000001700000000-002-0000000042.seg"
        );
        let catalog = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            segment_key(Some(catalog), None, stem),
            "segments/c0123456789abcdef0123456789abcdef/0000001700000000-002-0000000042.seg"
        );
        assert_eq!(
            segment_keys(Some(catalog), Some(3), stem),
            [
                "segments/c0123456789abcdef0123456789abcdef/n3/0000001700000000-002-0000000042.seg",
                "segments/n3/0000001700000000-002-0000000042.seg"
            ]
        );
        assert_eq!(
            segment_keys(None, Some(3), stem),
            ["segments/n3/0000001700000000-002-0000000042.seg"]
        );
        assert_eq!(epoch_of(stem), Some(1_700_000_000));
        assert_eq!(epoch_of("junk"), None);
        assert_eq!(epoch_of(""), None);
    }
}
