use super::*;
use crate::frame::FRAME_KIND_RECORD;

/// A version-2 WAL file of `rounds` rounds of one-record requests `(stream, offset, body)`,
/// padded with zeros as a pre-allocated file is; and each data frame's file position.
fn wal_v2(rounds: &[&[(u64, u64, &[u8])]]) -> (Vec<u8>, Vec<usize>) {
    let mut file = Vec::new();
    let mut positions = Vec::new();
    for (i, round) in rounds.iter().enumerate() {
        for (stream_id, offset, body) in round.iter() {
            positions.push(file.len());
            encode_frame(&mut file, record(*stream_id, *offset), &[], body);
        }
        // A timestamp with no zero byte, so a cut anywhere in the record changes it.
        end_round(&mut file, i as u64 + 1, &[], 0x1122_3344_5566_7788);
    }
    file.resize(file.len() + 4096, 0);
    (file, positions)
}

fn record(stream_id: u64, offset: u64) -> FrameMeta<'static> {
    FrameMeta {
        kind: FRAME_KIND_RECORD,
        stream_id,
        offset,
        timestamp_ms: 7,
        request_end: true,
        producer: None,
        writer_seq: None,
    }
}

fn offsets(frames: &[FoundFrame]) -> Vec<(u64, u64)> {
    frames.iter().map(|f| (f.stream_id, f.offset)).collect()
}

const THREE_ROUNDS: &[&[(u64, u64, &[u8])]] = &[
    &[(1, 0, b"a0"), (2, 0, b"b0")],
    &[(1, 1, b"a1 is a longer body"), (1, 2, b"a2")],
    &[(2, 1, b"b1"), (1, 3, b"a3")],
];

#[test]
fn a_whole_file_keeps_every_round_and_ends_clean() {
    let (file, _) = wal_v2(THREE_ROUNDS);
    let scanned = scan(&file).unwrap();
    assert_eq!(scanned.version, WAL_FORMAT_VERSION);
    assert_eq!(scanned.end, WalEnd::Clean);
    assert_eq!(
        offsets(&scanned.committed),
        [(1, 0), (2, 0), (1, 1), (1, 2), (2, 1), (1, 3)]
    );
    // The segment's bytes are the whole rounds, commit records included, as a running core
    // stores them; six of their frames are records.
    let segment = scanned.segment_bytes(&file);
    assert_eq!(segment, &file[..file.len() - 4096]);
    let (mut pos, mut records) = (0, 0);
    while let Ok((header, len)) = check_frame(segment, pos) {
        records += usize::from(header.kind == FRAME_KIND_RECORD);
        pos += len;
    }
    assert_eq!((pos, records), (segment.len(), 6));
}

#[test]
fn an_empty_file_is_clean_and_holds_nothing() {
    let scanned = scan(&[0u8; 8192]).unwrap();
    assert_eq!((scanned.committed.len(), scanned.end), (0, WalEnd::Clean));
    let header_only = [file_header(WAL_FORMAT_VERSION, 1).to_vec(), vec![0; 4096]].concat();
    let scanned = scan(&header_only).unwrap();
    assert_eq!((scanned.committed.len(), scanned.end), (0, WalEnd::Clean));
}

#[test]
fn a_last_round_cut_anywhere_is_a_torn_end_and_keeps_the_rounds_before_it() {
    let (file, positions) = wal_v2(THREE_ROUNDS);
    let last_round_start = positions[4];
    let last_commit_end = file.len() - 4096;
    // Every cut inside the last round, its commit record included, as a crash leaves it
    // (what was not written reads as the pre-allocated zeros).
    for cut in last_round_start..last_commit_end {
        let mut torn = file.clone();
        torn[cut..].fill(0);
        let scanned = scan(&torn).unwrap();
        // (A cut right at the round's start left nothing of it: a clean end.)
        let expected_torn = cut > last_round_start;
        assert_eq!(
            matches!(scanned.end, WalEnd::Torn { .. }),
            expected_torn,
            "cut at {cut}: {:?}",
            scanned.end
        );
        assert_eq!(
            offsets(&scanned.committed),
            [(1, 0), (2, 0), (1, 1), (1, 2)]
        );
    }
    // A middle sector of the last round lost while the bytes after it landed (writes torn
    // out of order) but its commit record did not: still a torn end.
    let mut torn = file.clone();
    torn[positions[4]..positions[4] + 30].fill(0);
    torn[last_commit_end - WAL_MARKER_LEN..last_commit_end].fill(0);
    let scanned = scan(&torn).unwrap();
    assert!(matches!(scanned.end, WalEnd::Torn { .. }));
    assert_eq!(scanned.committed.len(), 4);
}

#[test]
fn a_flipped_byte_in_any_acknowledged_round_is_damage_never_a_clean_end() {
    let (file, positions) = wal_v2(THREE_ROUNDS);
    let data_end = file.len() - 4096;
    // Every byte of rounds 1 and 2 (frames and commit records) and of round 3's frames: each
    // flip is reported as damage, with what lies past it.
    for at in 0..data_end - WAL_MARKER_LEN {
        let mut damaged = file.clone();
        damaged[at] ^= 0x10;
        let scanned = scan(&damaged).unwrap();
        let WalEnd::Damaged(damage) = &scanned.end else {
            panic!("flip at {at}: {:?}", scanned.end);
        };
        assert!(damage.at <= at, "flip at {at} reported at {}", damage.at);
        assert!(
            !damage.after.is_empty() || at >= positions[5],
            "flip at {at}: frames past the damage are found"
        );
    }
}

#[test]
fn a_flipped_body_byte_names_the_record_it_hit_and_the_frames_after_it() {
    let (file, positions) = wal_v2(THREE_ROUNDS);
    let mut damaged = file.clone();
    damaged[positions[2] + FRAME_HEADER_LEN + 3] ^= 1; // a1's body
    let scanned = scan(&damaged).unwrap();
    let WalEnd::Damaged(damage) = scanned.end else {
        panic!("not damage")
    };
    assert_eq!(damage.at, positions[2]);
    assert_eq!(damage.resumes_at, Some(positions[3]));
    assert_eq!(damage.claimed, Some((1, 1)));
    assert_eq!(offsets(&damage.before), [(1, 0), (2, 0)]);
    assert_eq!(offsets(&damage.after), [(1, 2), (2, 1), (1, 3)]);
    assert!(damage.why.contains("round 3"), "{}", damage.why);
    // Only whole rounds count as committed.
    assert_eq!(offsets(&scanned.committed), [(1, 0), (2, 0)]);
}

#[test]
fn a_zeroed_frame_header_mid_file_is_damage_not_the_end() {
    // A length of zero is how the end looks; mid-file, with rounds after it, it is damage.
    let (file, positions) = wal_v2(THREE_ROUNDS);
    let mut damaged = file.clone();
    damaged[positions[2]..positions[2] + 4].fill(0);
    let scanned = scan(&damaged).unwrap();
    assert!(
        matches!(scanned.end, WalEnd::Damaged(_)),
        "{:?}",
        scanned.end
    );
}

#[test]
fn damage_in_the_zeros_past_the_last_round_loses_nothing() {
    let (file, _) = wal_v2(THREE_ROUNDS);
    let mut damaged = file.clone();
    let at = file.len() - 100;
    damaged[at] = 0x5a;
    let scanned = scan(&damaged).unwrap();
    assert!(
        matches!(scanned.end, WalEnd::Torn { .. }),
        "{:?}",
        scanned.end
    );
    assert_eq!(scanned.committed.len(), 6);
}

#[test]
fn a_commit_record_out_of_sequence_is_damage() {
    let (mut file, positions) = wal_v2(THREE_ROUNDS);
    // Round 2's commit record says round 5 (with a valid CRC): not a torn write.
    let commit_at = positions[4] - WAL_MARKER_LEN;
    file[commit_at..positions[4]].copy_from_slice(&commit_record(5, commit_at as u64, 2));
    let scanned = scan(&file).unwrap();
    let WalEnd::Damaged(damage) = scanned.end else {
        panic!("not damage")
    };
    assert!(damage.why.contains("round 5"), "{}", damage.why);
}

#[test]
fn a_newer_format_is_refused_with_both_versions_named() {
    let mut file = file_header(9, 1).to_vec();
    file.resize(4096, 0);
    let e = scan(&file).unwrap_err().to_string();
    assert!(e.contains("version 9") && e.contains("1 and 2"), "{e}");
}

/// A version-1 file (no header): three one-record requests.
fn wal_v1() -> (Vec<u8>, Vec<usize>) {
    let mut file = Vec::new();
    let mut positions = Vec::new();
    for (offset, body) in [b"first", b"other", b"third"].iter().enumerate() {
        positions.push(file.len());
        encode_frame(&mut file, record(1, offset as u64), &[], &body[..]);
    }
    file.resize(file.len() + 4096, 0);
    (file, positions)
}

#[test]
fn version_one_files_keep_whole_requests_and_report_damage_before_valid_frames() {
    let (file, positions) = wal_v1();
    let scanned = scan(&file).unwrap();
    assert_eq!((scanned.version, scanned.committed.len()), (1, 3));
    assert_eq!(scanned.end, WalEnd::Clean);
    // A torn last frame: the first two are kept.
    let mut torn = file.clone();
    torn[positions[2] + 10..].fill(0);
    let scanned = scan(&torn).unwrap();
    assert!(matches!(scanned.end, WalEnd::Torn { .. }));
    assert_eq!(scanned.committed.len(), 2);
    // A flipped byte in the second frame, the third intact after it: damage.
    let mut damaged = file.clone();
    damaged[positions[1] + FRAME_HEADER_LEN + 1] ^= 0xff;
    let WalEnd::Damaged(damage) = scan(&damaged).unwrap().end else {
        panic!("not damage")
    };
    assert_eq!(
        (damage.claimed, offsets(&damage.after)),
        (Some((1, 1)), vec![(1, 2)])
    );
}

#[test]
fn rounds_written_as_a_core_writes_them_read_back_whole_after_each_round() {
    // A pre-allocated file written round by round in 512-byte blocks, each round rewriting
    // the last partial block, some with epoch records: after each, the scan finds every
    // round whole, its records, and the epochs.
    let align = 512;
    let mut file = vec![0u8; 64 * 1024];
    let (mut segment, mut durable, mut records) = (Vec::new(), 0, 0);
    for round in 1..=40u64 {
        for i in 0..round % 4 + 1 {
            let body = vec![b'x'; (round * 37 + i * 11) as usize % 300];
            encode_frame(&mut segment, record(round % 3, round * 10 + i), &[], &body);
            records += 1;
        }
        let epochs: Vec<(u64, u64)> = (0..round % 3).map(|s| (s, round)).collect();
        end_round(&mut segment, round, &epochs, 5);
        let start = durable / align * align;
        file[start..segment.len()].copy_from_slice(&segment[start..]);
        durable = segment.len();
        let scanned = scan(&file).unwrap();
        assert_eq!(scanned.end, WalEnd::Clean, "after round {round}");
        assert_eq!(
            scanned.segment_bytes(&file),
            &segment[..],
            "after round {round}"
        );
        assert_eq!(scanned.committed.len(), records, "after round {round}");
        for (stream_id, epoch) in &epochs {
            assert_eq!(
                scanned.epochs.get(stream_id),
                Some(epoch),
                "after round {round}"
            );
        }
    }
}

/// A WAL file is pre-allocated and a crash never shortens it: a file whose bytes end inside a
/// frame or inside a round (`truncate`, a copy cut short) lost what followed, acknowledged or
/// not, and is damage naming the frame cut through, never a torn end. Cut exactly at a round's
/// end it is what a `file://` upload leaves (the sealed file linked as its object): clean.
#[test]
fn a_file_cut_short_is_damage_never_a_torn_end() {
    let (file, positions) = wal_v2(THREE_ROUNDS);
    let second_round_end = positions[4];
    // (Inside the first round, a cut at a frame's end reads as a version-1 file: one without
    // commit records, whose every whole request counts.)
    for cut in positions[2] + 1..file.len() - 4096 {
        let scanned = scan(&file[..cut]).unwrap();
        let round_end = [positions[2], second_round_end, file.len() - 4096].contains(&cut);
        match scanned.end {
            WalEnd::Damaged(damage) => {
                assert!(!round_end, "cut at {cut}, a round's end: {damage:?}");
                assert!(damage.cut, "cut at {cut}: {damage:?}");
                assert!(damage.why.contains("cut"), "{}", damage.why);
            }
            end => assert!(round_end, "cut at {cut}: {end:?}"),
        }
    }
    // Inside the first round's second frame.
    assert!(
        matches!(scan(&file[..positions[1] + 7]).unwrap().end, WalEnd::Damaged(ref d) if d.cut)
    );
    // Cut inside the second round's second record: its header names it.
    let WalEnd::Damaged(damage) = scan(&file[..positions[3] + FRAME_HEADER_LEN + 1])
        .unwrap()
        .end
    else {
        panic!("not damage")
    };
    assert_eq!(damage.claimed, Some((1, 2)));
    assert_eq!(offsets(&damage.before), [(1, 0), (2, 0), (1, 1)]);
    // Cut right after a round's records, before its commit record: damage too.
    let WalEnd::Damaged(damage) = scan(&file[..second_round_end - WAL_MARKER_LEN])
        .unwrap()
        .end
    else {
        panic!("not damage")
    };
    assert!(damage.cut);
    // A flipped bit in the zeros right past the last round, where a length would be: not a cut.
    let mut flipped = file.clone();
    flipped[file.len() - 4096 + 2] = 0x40;
    assert_eq!(scan(&flipped).unwrap().committed.len(), 6);
    assert!(!matches!(scan(&flipped).unwrap().end, WalEnd::Damaged(_)));
}
