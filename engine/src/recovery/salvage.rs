//! Bringing a node up past a damaged WAL file, when the operator asked for it
//! (`--wal-salvage`): what can still be read in order is kept, every stream that lost
//! acknowledged records is closed at its first lost offset so that no lost offset is ever
//! handed out again, and exactly what was lost is written down.

use std::collections::{BTreeMap, HashMap};

use pico_meta::Snapshot;

use crate::frame::{FRAME_KIND_CLOSE, FRAME_KIND_RECORD};
use crate::rules::ForkOrigin;
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

/// A stream whose records in an intact WAL file start past where the catalog and the WAL files
/// before it end: the records in between were acknowledged in a WAL file that is gone
/// (deleted, or lost with part of the disk).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gap {
    pub(crate) stream_id: u64,
    /// Where the stream's records should have gone on: its first lost offset.
    pub(crate) expected: u64,
    /// The offset its records in the file start at.
    pub(crate) found: u64,
    /// One past the highest offset the file holds for it.
    pub(crate) seen_to: u64,
}

/// The streams' next offsets as recovery learns them, and the streams a salvage closed, over
/// all the WAL files of one boot (a later file must not add records past a close).
pub(crate) struct Tails {
    next: HashMap<u64, u64>,
    closed: HashMap<u64, u64>,
    names: HashMap<u64, String>,
}

impl Tails {
    /// Every live stream's tail as the catalog has it (as a start seeds it: its stored
    /// records, its trim point, a fork's first own offset); a stream without one is deleted.
    pub(crate) fn new(snapshot: &Snapshot) -> Tails {
        let mut next: HashMap<u64, u64> = snapshot
            .streams
            .iter()
            .map(|row| {
                let fork_base = row.fork.as_ref().map_or(0, ForkOrigin::base_of);
                (row.id, row.start_offset.max(fork_base))
            })
            .collect();
        for segment in &snapshot.segments {
            for entry in &segment.streams {
                let end = entry.runs.iter().map(|r| r.next_offset).max().unwrap_or(0);
                if let Some(tail) = next.get_mut(&entry.stream_id) {
                    *tail = end.max(*tail);
                }
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

    /// The streams whose records in `frames` (an intact file's, in order) skip offsets past
    /// their tail. Deleted streams are not checked: nothing of theirs is read again.
    pub(crate) fn gaps(&self, frames: &[FoundFrame]) -> Vec<Gap> {
        let mut next: HashMap<u64, u64> = HashMap::new();
        let mut gaps: BTreeMap<u64, Gap> = BTreeMap::new();
        for frame in frames {
            let id = frame.stream_id;
            if self.closed.contains_key(&id) {
                continue;
            }
            let after = next_after(frame);
            if let Some(gap) = gaps.get_mut(&id) {
                gap.seen_to = gap.seen_to.max(after);
                continue;
            }
            let expected = next.get(&id).or_else(|| self.next.get(&id)).copied();
            if let Some(expected) = expected.filter(|e| frame.offset > *e) {
                gaps.insert(
                    id,
                    Gap {
                        stream_id: id,
                        expected,
                        found: frame.offset,
                        seen_to: after,
                    },
                );
                continue;
            }
            next.insert(id, after);
        }
        gaps.into_values().collect()
    }

    /// The segment bytes a salvage keeps of an intact file with `gaps`: every frame but the
    /// gapped streams', then a close frame for each at its first lost offset, so no lost
    /// offset is handed out again; and what each lost.
    pub(crate) fn salvage_gaps(
        &mut self,
        data: &[u8],
        frames: &[FoundFrame],
        gaps: &[Gap],
        now_ms: i64,
    ) -> (Vec<u8>, BTreeMap<u64, Lost>) {
        let mut lost = BTreeMap::new();
        for gap in gaps {
            self.closed.insert(gap.stream_id, gap.expected);
            self.next.insert(gap.stream_id, gap.expected);
            lost.insert(
                gap.stream_id,
                Lost {
                    from: gap.expected,
                    seen_to: Some(gap.seen_to),
                },
            );
        }
        let (mut out, _) = self.kept(data, frames);
        for gap in gaps {
            salvage_close(&mut out, gap.stream_id, gap.expected, now_ms);
        }
        (out, lost)
    }

    /// The bytes of the `frames` of `data` that may be kept (`keep`), end to end, and whether
    /// every one was.
    pub(crate) fn kept(&mut self, data: &[u8], frames: &[FoundFrame]) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut all = true;
        for frame in frames {
            if self.keep(frame) {
                out.extend_from_slice(&data[frame.pos..frame.pos + frame.len]);
            } else {
                all = false;
            }
        }
        (out, all)
    }

    fn saw(&mut self, frame: &FoundFrame) {
        self.next.insert(frame.stream_id, next_after(frame));
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
        let (mut out, _) = self.kept(data, &damage.before);
        let mut lost: BTreeMap<u64, Lost> = BTreeMap::new();
        let keep = |out: &mut Vec<u8>, frame: &FoundFrame| {
            out.extend_from_slice(&data[frame.pos..frame.pos + frame.len]);
        };
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

/// The stream's next offset once `frame` is in: past a record, at a close.
fn next_after(frame: &FoundFrame) -> u64 {
    if frame.kind == FRAME_KIND_RECORD {
        frame.offset + 1
    } else {
        frame.offset
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
            ..Default::default()
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
            ..Default::default()
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

    fn live(id: u64, start_offset: u64, fork_offset: Option<u64>) -> pico_meta::StreamRow {
        pico_meta::StreamRow {
            id,
            name: format!("/s/{id}"),
            config: pico_meta::StreamConfig {
                content_type: "text/plain".into(),
                ttl_sec: None,
                expires_at_ms: None,
                retention: Default::default(),
            },
            closed: false,
            created_ms: 1,
            start_offset,
            last_access_ms: 1,
            fork: fork_offset.map(|offset| pico_meta::ForkRow {
                source: "/s/0".into(),
                source_id: 0,
                offset,
                partial_bytes: 0,
            }),
            soft_deleted: false,
        }
    }

    #[test]
    fn records_that_skip_past_a_streams_tail_are_a_gap_and_a_salvage_closes_it_there() {
        // Stream 1 has records 0..5 in the catalog; stream 2 is a fork whose own records start
        // at 10; stream 3 was trimmed to 7 (its segments collected); stream 4 is deleted.
        let snapshot = Snapshot {
            streams: vec![live(1, 0, None), live(2, 0, Some(10)), live(3, 7, None)],
            segments: vec![pico_meta::SegmentRecord {
                key: "k".into(),
                size_bytes: 100,
                created_ms: 1,
                streams: vec![pico_meta::SegmentStreamEntry {
                    stream_id: 1,
                    runs: vec![pico_meta::SegmentRun {
                        first_offset: 0,
                        next_offset: 5,
                        byte_start: 0,
                        byte_end: 100,
                    }],
                    last_timestamp_ms: 1,
                    closed: false,
                    producers: Vec::new(),
                    closed_by: None,
                    writer_seq: None,
                }],
            }],
            ..Default::default()
        };
        let in_order = [(1, 5), (2, 10), (3, 7), (4, 99), (1, 6), (2, 11)];
        let (data, _) = file(&in_order, 2);
        let tails = Tails::new(&snapshot);
        assert_eq!(tails.gaps(&scan(&data).unwrap().committed), []);

        // Stream 1 goes on at 7 (5 and 6 are lost); stream 2 at 12 (10 and 11).
        let (data, _) = file(&[(1, 7), (2, 12), (3, 7), (1, 8), (2, 13), (3, 8)], 2);
        let scanned = scan(&data).unwrap();
        let mut tails = Tails::new(&snapshot);
        let gaps = tails.gaps(&scanned.committed);
        assert_eq!(
            gaps,
            [
                Gap {
                    stream_id: 1,
                    expected: 5,
                    found: 7,
                    seen_to: 9
                },
                Gap {
                    stream_id: 2,
                    expected: 10,
                    found: 12,
                    seen_to: 14
                },
            ]
        );
        let (segment, lost) = tails.salvage_gaps(&data, &scanned.committed, &gaps, 9);
        assert_eq!(
            frames(&segment),
            [
                (FRAME_KIND_RECORD, 3, 7),
                (FRAME_KIND_RECORD, 3, 8),
                (FRAME_KIND_CLOSE, 1, 5),
                (FRAME_KIND_CLOSE, 2, 10),
            ]
        );
        assert_eq!(
            lost[&1],
            Lost {
                from: 5,
                seen_to: Some(9)
            }
        );
        // A later file's records of a closed stream are neither a gap nor kept.
        let (later, _) = file(&[(1, 9), (3, 9)], 2);
        let later = scan(&later).unwrap().committed;
        assert_eq!(tails.gaps(&later), []);
        assert!(!tails.keep(&later[0]));
        assert!(tails.keep(&later[1]));
    }
}
