//! The packed form of a [`SegmentStreamEntry`]'s producer states, stored as BLOBs.
//!
//! Like the runs (see `runs.rs`), producer states are only ever read whole at startup, so the
//! producers of one (segment, stream) pair are one BLOB rather than rows of their own. A
//! producer id is a client-chosen string, so records are variable-length:
//!
//! ```text
//!  producer i, 18 + n bytes, integers little-endian (stable, persisted: changing it needs a
//!  migration)
//! ┌───────────┬────────────────────┬──────────────┬──────────────┐
//! │ id length │ id                 │ epoch        │ seq          │
//! │ u16, = n  │ n bytes of UTF-8   │ u64, 8 bytes │ u64, 8 bytes │
//! │ 2 bytes   │ (n may be 0)       │              │              │
//! └───────────┴────────────────────┴──────────────┴──────────────┘
//!
//!  segment_streams.producers   producer 0 ‖ producer 1 ‖ … , sorted by id (strictly: ids are
//!                              unique), compared as bytes (= `String`'s order); 0 producers =
//!                              the empty BLOB
//!  segment_streams.closed_by   exactly one producer record, nothing before or after it;
//!                              no producer = SQL NULL (never the empty BLOB)
//! ```
//!
//! Decoding is strict and never panics: a truncated record, trailing bytes, an id that is not
//! UTF-8, or producers out of order are all `None` (a damaged or foreign database, never
//! something this crate writes); the caller turns that into an error naming the segment.
//!
//! [`SegmentStreamEntry`]: crate::SegmentStreamEntry

use crate::ProducerState;

/// Bytes of one packed producer besides its id: the length prefix, epoch and seq.
pub(crate) const FIXED_SIZE_BYTES: usize = 2 + 8 + 8;

/// Packs producers in the order given (the caller checked they are sorted and unique); `None`
/// when an id is longer than [`PRODUCER_ID_MAX_BYTES`](crate::limits::PRODUCER_ID_MAX_BYTES).
pub(crate) fn encode(producers: &[ProducerState]) -> Option<Vec<u8>> {
    let size = producers
        .iter()
        .map(|producer| FIXED_SIZE_BYTES + producer.id.len())
        .sum();
    let mut blob = Vec::with_capacity(size);
    for producer in producers {
        push(&mut blob, producer)?;
    }
    debug_assert_eq!(blob.len(), size);
    Some(blob)
}

/// Packs one producer (the `closed_by` column); `None` when its id is too long.
pub(crate) fn encode_one(producer: &ProducerState) -> Option<Vec<u8>> {
    let mut blob = Vec::with_capacity(FIXED_SIZE_BYTES + producer.id.len());
    push(&mut blob, producer)?;
    Some(blob)
}

fn push(blob: &mut Vec<u8>, producer: &ProducerState) -> Option<()> {
    let length = u16::try_from(producer.id.len()).ok()?;
    blob.extend_from_slice(&length.to_le_bytes());
    blob.extend_from_slice(producer.id.as_bytes());
    blob.extend_from_slice(&producer.epoch.to_le_bytes());
    blob.extend_from_slice(&producer.seq.to_le_bytes());
    Some(())
}

/// Unpacks a BLOB written by [`encode`]; `None` when it is malformed (see the module docs).
pub(crate) fn decode(blob: &[u8]) -> Option<Vec<ProducerState>> {
    let mut rest = blob;
    let mut producers: Vec<ProducerState> = Vec::new();
    while !rest.is_empty() {
        let producer = take(&mut rest)?;
        if producers.last().is_some_and(|last| last.id >= producer.id) {
            return None;
        }
        producers.push(producer);
    }
    Some(producers)
}

/// Unpacks a BLOB written by [`encode_one`]; `None` unless it is exactly one producer.
pub(crate) fn decode_one(blob: &[u8]) -> Option<ProducerState> {
    let mut rest = blob;
    let producer = take(&mut rest)?;
    rest.is_empty().then_some(producer)
}

/// Reads one producer off the front of `rest` and advances it; `None` (with `rest` in an
/// unspecified position) when the record is truncated or its id is not UTF-8.
fn take(rest: &mut &[u8]) -> Option<ProducerState> {
    let length = u16::from_le_bytes(split::<2>(rest)?) as usize;
    if rest.len() < length {
        return None;
    }
    let (id, tail) = rest.split_at(length);
    let id = std::str::from_utf8(id).ok()?.to_string();
    *rest = tail;
    let epoch = u64::from_le_bytes(split::<8>(rest)?);
    let seq = u64::from_le_bytes(split::<8>(rest)?);
    Some(ProducerState { id, epoch, seq })
}

/// Splits `N` bytes off the front of `rest`; `None` when fewer are left.
fn split<const N: usize>(rest: &mut &[u8]) -> Option<[u8; N]> {
    let (head, tail) = rest.split_first_chunk::<N>()?;
    *rest = tail;
    Some(*head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::PRODUCER_ID_MAX_BYTES;

    fn producer(id: &str, epoch: u64, seq: u64) -> ProducerState {
        ProducerState {
            id: id.to_string(),
            epoch,
            seq,
        }
    }

    /// A small deterministic generator (xorshift64*), so the property tests need no extra
    /// dependency and every failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, bound: u64) -> u64 {
            self.next() % bound
        }

        /// Edge values often, arbitrary ones otherwise.
        fn word(&mut self) -> u64 {
            match self.below(4) {
                0 => 0,
                1 => u64::MAX - self.below(2),
                _ => self.next(),
            }
        }

        fn id(&mut self) -> String {
            const ALPHABET: [char; 6] = ['a', 'b', 'Z', '0', 'é', '→'];
            let length = self.below(12) as usize;
            (0..length)
                .map(|_| ALPHABET[self.below(ALPHABET.len() as u64) as usize])
                .collect()
        }

        /// Up to 7 producers with distinct ids, sorted by id.
        fn producers(&mut self) -> Vec<ProducerState> {
            let mut producers: Vec<ProducerState> = (0..self.below(8))
                .map(|_| ProducerState {
                    id: self.id(),
                    epoch: self.word(),
                    seq: self.word(),
                })
                .collect();
            producers.sort_by(|a, b| a.id.cmp(&b.id));
            producers.dedup_by(|a, b| a.id == b.id);
            producers
        }
    }

    #[test]
    fn round_trip() {
        let producers = vec![
            producer("", 0, 0),
            producer("client-1", 3, 41),
            producer("client-2", u64::MAX, u64::MAX),
            producer("ünïcødé", 1, 2),
        ];
        let blob = encode(&producers).unwrap();
        assert_eq!(
            blob.len(),
            4 * FIXED_SIZE_BYTES + "client-1client-2ünïcødé".len()
        );
        assert_eq!(decode(&blob).unwrap(), producers);
        assert_eq!(encode(&[]).unwrap(), Vec::<u8>::new());
        assert_eq!(decode(&[]).unwrap(), vec![]);

        let one = producer("p", 7, 9);
        assert_eq!(decode_one(&encode_one(&one).unwrap()).unwrap(), one);
        assert_eq!(encode_one(&one), encode(std::slice::from_ref(&one)));
    }

    #[test]
    fn layout_is_length_prefixed_little_endian() {
        let blob = encode(&[producer("ab", 1, 2)]).unwrap();
        assert_eq!(&blob[0..2], &2u16.to_le_bytes());
        assert_eq!(&blob[2..4], b"ab");
        assert_eq!(&blob[4..12], &1u64.to_le_bytes());
        assert_eq!(&blob[12..20], &2u64.to_le_bytes());
        assert_eq!(blob.len(), 20);
    }

    #[test]
    fn longest_id_fits_and_longer_is_refused() {
        let longest = producer(&"x".repeat(PRODUCER_ID_MAX_BYTES), 1, 1);
        let blob = encode_one(&longest).unwrap();
        assert_eq!(decode_one(&blob).unwrap(), longest);
        let too_long = producer(&"x".repeat(PRODUCER_ID_MAX_BYTES + 1), 1, 1);
        assert!(encode_one(&too_long).is_none());
        assert!(encode(&[producer("a", 0, 0), too_long]).is_none());
    }

    #[test]
    fn malformed_blobs_are_rejected() {
        let good = encode(&[producer("a", 1, 1), producer("b", 2, 2)]).unwrap();
        // Trailing garbage shorter than a record.
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(decode(&trailing).is_none());
        // A length prefix pointing past the end.
        assert!(decode(&[5, 0, b'a', b'b']).is_none());
        assert!(decode(&[0xff, 0xff]).is_none());
        assert!(decode(&[1]).is_none());
        // An id that is not UTF-8.
        let mut not_utf8 = encode(&[producer("a", 1, 1)]).unwrap();
        not_utf8[2] = 0xff;
        assert!(decode(&not_utf8).is_none());
        assert!(decode_one(&not_utf8).is_none());
        // Out of order, and duplicated.
        let unsorted = encode(&[producer("b", 1, 1), producer("a", 1, 1)]).unwrap();
        assert!(decode(&unsorted).is_none());
        let duplicated = encode(&[producer("a", 1, 1), producer("a", 2, 2)]).unwrap();
        assert!(decode(&duplicated).is_none());
        // closed_by holds exactly one record.
        assert!(decode_one(&[]).is_none());
        assert!(decode_one(&good).is_none());
    }

    #[test]
    fn property_round_trip() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2_000 {
            let producers = rng.producers();
            let blob = encode(&producers).unwrap();
            assert_eq!(decode(&blob).as_ref(), Some(&producers), "{blob:?}");
            for producer in &producers {
                let one = encode_one(producer).unwrap();
                assert_eq!(decode_one(&one).as_ref(), Some(producer));
            }
        }
    }

    #[test]
    fn property_truncated_is_rejected() {
        let mut rng = Rng(0x0123_4567_89ab_cdef);
        for _ in 0..500 {
            let producers = rng.producers();
            let blob = encode(&producers).unwrap();
            // Record boundaries: cutting exactly there leaves a valid, shorter list.
            let mut boundaries = vec![0];
            for producer in &producers {
                let last = *boundaries.last().unwrap();
                boundaries.push(last + FIXED_SIZE_BYTES + producer.id.len());
            }
            for cut in 0..blob.len() {
                match boundaries.iter().position(|&boundary| boundary == cut) {
                    Some(count) => assert_eq!(decode(&blob[..cut]).unwrap(), producers[..count]),
                    None => assert!(decode(&blob[..cut]).is_none(), "cut {cut} of {blob:?}"),
                }
            }
            for producer in &producers {
                let one = encode_one(producer).unwrap();
                for cut in 0..one.len() {
                    assert!(decode_one(&one[..cut]).is_none(), "cut {cut} of {one:?}");
                }
            }
        }
    }

    #[test]
    fn property_arbitrary_bytes_never_panic() {
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        for _ in 0..5_000 {
            let length = rng.below(64) as usize;
            let blob: Vec<u8> = (0..length)
                .map(|_| match rng.below(3) {
                    // Small bytes make plausible length prefixes; the rest is noise.
                    0 => rng.below(4) as u8,
                    _ => rng.next() as u8,
                })
                .collect();
            if let Some(producers) = decode(&blob) {
                // Whatever decodes is canonical: it encodes back to the same bytes.
                assert_eq!(encode(&producers).unwrap(), blob);
            }
            if let Some(producer) = decode_one(&blob) {
                assert_eq!(encode_one(&producer).unwrap(), blob);
            }
        }
    }
}
