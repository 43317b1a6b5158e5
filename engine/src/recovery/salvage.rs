//! Bringing a node up past a damaged WAL file, when the operator asked for it
//! (`--wal-salvage`): what can still be read in order is kept, every stream that lost
//! acknowledged records is closed at its first lost offset so that no lost offset is ever
//! handed out again, and exactly what was lost is written down.

use std::collections::{BTreeMap, HashMap};

use pico_meta::Snapshot;

use crate::frame::{FRAME_KIND_CLOSE, FRAME_KIND_RECORD};
use crate::wal_file::{salvage_close, Damage, FoundFrame};

/// What one stream lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lost {
    /// The first lost offset: the stream is closed here.
    pub(crate) from: u64,
    /// One past the highest offset seen in the file for it (records from `from` up to here
    /// were acknowledged and are not restored), when any was seen.
    pub(crate) seen_to: Option<u64>,
}

/// The streams' next offsets as recovery learns them, and the streams a salvage closed, over
/// all the WAL files of one boot (a later file must not add records past a close).
pub(crate) struct Tails {
    next: HashMap<u64, u64>,
    closed: HashMap<u64, u64>,
    names: HashMap<u64, String>,
}

impl Tails {
    pub(crate) fn new(snapshot: &Snapshot) -> Tails {
        let mut next = HashMap::new();
        for segment in &snapshot.segments {
            for entry in &segment.streams {
                let end = entry.runs.iter().map(|r| r.next_offset).max().unwrap_or(0);
                let tail = next.entry(entry.stream_id).or_insert(0);
                *tail = end.max(*tail);
            }
        }
        let names = snapshot
            .streams
            .iter()
            .map(|s| (s.id, s.name.clone()))
            .collect();
        Tails {
            next,
            closed: HashMap::new(),
            names,
        }
    }

    /// A stream's name for a report (its id when it has none: deleted since).
    pub(crate) fn name(&self, stream_id: u64) -> String {
        match self.names.get(&stream_id) {
            Some(name) => format!("{name} (id {stream_id})"),
            None => format!("id {stream_id}"),
        }
    }

    fn saw(&mut self, frame: &FoundFrame) {
        let next = if frame.kind == FRAME_KIND_RECORD {
            frame.offset + 1
        } else {
            frame.offset
        };
        self.next.insert(frame.stream_id, next);
    }

    /// Whether a frame of an intact file may be kept: not one of a stream a salvage closed.
    pub(crate) fn keep(&mut self, frame: &FoundFrame) -> bool {
        if self.closed.contains_key(&frame.stream_id) {
            return false;
        }
        self.saw(frame);
        true
    }

    /// The segment bytes a salvage keeps of a damaged file, and what each stream lost: the
    /// frames before the damage; past it, each stream's frames while they go on from its
    /// tail without a gap; then a close frame for each stream that lost records.
    pub(crate) fn salvage(
        &mut self,
        data: &[u8],
        damage: &Damage,
        now_ms: i64,
    ) -> (Vec<u8>, BTreeMap<u64, Lost>) {
        let mut out = Vec::new();
        let mut lost: BTreeMap<u64, Lost> = BTreeMap::new();
        let keep = |out: &mut Vec<u8>, frame: &FoundFrame| {
            out.extend_from_slice(&data[frame.pos..frame.pos + frame.len]);
        };
        for frame in &damage.before {
            if self.keep(frame) {
                keep(&mut out, frame);
            }
        }
        // The record the damaged frame held, when its header can be believed.
        if let Some((stream_id, offset)) = damage.claimed {
            if !self.closed.contains_key(&stream_id) {
                let from = self.next.get(&stream_id).copied().unwrap_or(offset);
                lost.insert(
                    stream_id,
                    Lost {
                        from: from.min(offset),
                        seen_to: None,
                    },
                );
            }
        }
        // A cut file lost every round after the cut, of streams that cannot be known: each
        // stream it holds frames of may have had records there, so each is closed at its tail.
        if damage.cut {
            for frame in &damage.before {
                let id = frame.stream_id;
                if self.closed.contains_key(&id) || lost.contains_key(&id) {
                    continue;
                }
                let from = self.next.get(&id).copied().unwrap_or(frame.offset);
                lost.insert(
                    id,
                    Lost {
                        from,
                        seen_to: None,
                    },
                );
            }
        }
        for frame in &damage.after {
            let id = frame.stream_id;
            if self.closed.contains_key(&id) {
                continue;
            }
            let seen_to = if frame.kind == FRAME_KIND_CLOSE {
                frame.offset
            } else {
                frame.offset + 1
            };
            if let Some(lost) = lost.get_mut(&id) {
                lost.seen_to = Some(lost.seen_to.unwrap_or(0).max(seen_to));
                continue;
            }
            match self.next.get(&id) {
                // Unknown before: nothing to compare with, so it starts the stream here.
                None => {
                    self.saw(frame);
                    keep(&mut out, frame);
                }
                Some(&next) if frame.offset == next => {
                    self.saw(frame);
                    keep(&mut out, frame);
                }
                Some(&next) => {
                    lost.insert(
                        id,
                        Lost {
                            from: next,
                            seen_to: Some(seen_to),
                        },
                    );
                }
            }
        }
        for (id, lost) in &lost {
            salvage_close(&mut out, *id, lost.from, now_ms);
            self.closed.insert(*id, lost.from);
            self.next.insert(*id, lost.from);
        }
        (out, lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{check_frame, encode_frame, FrameMeta};
    use crate::wal_file::{end_round, scan, WalEnd};

    fn file(records: &[(u64, u64)], rounds_of: usize) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        let (mut positions, mut round) = (Vec::new(), 0u64);
        for (i, (stream_id, offset)) in records.iter().enumerate() {
            positions.push(out.len());
            let meta = FrameMeta {
                kind: FRAME_KIND_RECORD,
                stream_id: *stream_id,
                offset: *offset,
                timestamp_ms: 1,
                request_end: true,
                producer: None,
                writer_seq: None,
            };
            encode_frame(&mut out, meta, &[], b"body");
            if (i + 1) % rounds_of == 0 {
                round += 1;
                end_round(&mut out, round, &[], 1);
            }
        }
        out.resize(out.len() + 512, 0);
        (out, positions)
    }

    fn frames(segment: &[u8]) -> Vec<(u8, u64, u64)> {
        let (mut pos, mut out) = (0, Vec::new());
        while let Ok((header, len)) = check_frame(segment, pos) {
            out.push((header.kind, header.stream_id.get(), header.offset.get()));
            pos += len;
        }
        assert_eq!(pos, segment.len(), "the salvaged segment is whole frames");
        out
    }

    #[test]
    fn a_salvage_keeps_what_is_in_order_and_closes_each_stream_at_its_first_lost_offset() {
        // Streams 1 and 2 interleaved; stream 1's record 2 is damaged.
        let records = [
            (1, 0),
            (2, 0),
            (1, 1),
            (2, 1),
            (1, 2),
            (2, 2),
            (1, 3),
            (2, 3),
        ];
        let (mut data, positions) = file(&records, 2);
        data[positions[4] + 42] ^= 4;
        let WalEnd::Damaged(damage) = scan(&data).unwrap().end else {
            panic!("not damage")
        };
        let snapshot = Snapshot {
            streams: Vec::new(),
            segments: Vec::new(),
        };
        let mut tails = Tails::new(&snapshot);
        let (segment, lost) = tails.salvage(&data, &damage, 9);
        assert_eq!(
            lost.into_iter().collect::<Vec<_>>(),
            [(
                1,
                Lost {
                    from: 2,
                    seen_to: Some(4)
                }
            )]
        );
        assert_eq!(
            frames(&segment),
            [
                (FRAME_KIND_RECORD, 1, 0),
                (FRAME_KIND_RECORD, 2, 0),
                (FRAME_KIND_RECORD, 1, 1),
                (FRAME_KIND_RECORD, 2, 1),
                (FRAME_KIND_RECORD, 2, 2),
                (FRAME_KIND_RECORD, 2, 3),
                (FRAME_KIND_CLOSE, 1, 2),
            ]
        );
        // A later file's frames of the closed stream are not restored; the other's are.
        let later = FoundFrame {
            pos: 0,
            len: 0,
            kind: FRAME_KIND_RECORD,
            stream_id: 1,
            offset: 4,
            request_end: true,
        };
        assert!(!tails.keep(&later));
        assert!(tails.keep(&FoundFrame {
            stream_id: 2,
            ..later
        }));
    }

    #[test]
    fn a_damaged_last_record_of_a_stream_still_closes_it_from_its_header() {
        // Stream 1's only record past round 1 is damaged, and nothing of stream 1 follows.
        let records = [(1, 0), (2, 0), (1, 1), (2, 1), (2, 2), (2, 3)];
        let (mut data, positions) = file(&records, 2);
        data[positions[2] + 41] ^= 1;
        let WalEnd::Damaged(damage) = scan(&data).unwrap().end else {
            panic!("not damage")
        };
        let snapshot = Snapshot {
            streams: Vec::new(),
            segments: Vec::new(),
        };
        let (segment, lost) = Tails::new(&snapshot).salvage(&data, &damage, 9);
        assert_eq!(
            lost.get(&1),
            Some(&Lost {
                from: 1,
                seen_to: None
            })
        );
        assert_eq!(frames(&segment).last(), Some(&(FRAME_KIND_CLOSE, 1, 1)));
    }
}
