use super::*;
use crate::frame::{FrameMeta, ProducerTuple, FRAME_KIND_RECORD};

fn frame(
    kind: u8,
    stream_id: u64,
    offset: u64,
    timestamp_ms: i64,
    producer: Option<&ProducerTuple>,
) -> FrameMeta<'_> {
    FrameMeta {
        kind,
        stream_id,
        offset,
        timestamp_ms,
        request_end: true,
        producer,
        writer_seq: None,
    }
}

#[test]
fn index_rebuilds_runs_and_close() {
    let mut buf = Vec::new();
    let closer = ProducerTuple {
        id: "p".into(),
        epoch: 2,
        seq: 7,
    };
    let record = FRAME_KIND_RECORD;
    frame::encode_frame(&mut buf, frame(record, 1, 0, 10, None), &[], b"a");
    frame::encode_frame(&mut buf, frame(record, 1, 1, 11, None), &[], b"b");
    frame::encode_frame(&mut buf, frame(record, 2, 0, 12, None), &[], b"c");
    frame::encode_frame(&mut buf, frame(record, 1, 2, 13, None), &[], b"d");
    frame::encode_frame(
        &mut buf,
        frame(FRAME_KIND_CLOSE, 1, 3, 13, Some(&closer)),
        &[],
        b"",
    );
    let bytes = bytes::Bytes::from(buf);
    let record = index_segment("segments/x.seg".into(), &bytes);
    assert_eq!(record.streams.len(), 2);
    let one = &record.streams[0];
    // Offsets 0..2 and 2..3 lie on either side of stream 2's frame: one span covers both.
    assert_eq!(one.runs.len(), 1);
    assert_eq!((one.runs[0].first_offset, one.runs[0].next_offset), (0, 3));
    assert!(one.closed);
    assert_eq!(one.last_timestamp_ms, 13);
    assert_eq!(
        one.producers,
        vec![ProducerState {
            id: "p".into(),
            epoch: 2,
            seq: 7
        }]
    );
    assert_eq!(one.closed_by.as_ref().map(|p| p.seq), Some(7));
    assert!(!record.streams[1].closed);
}

/// Three one-record requests of stream 1 and where each frame ends.
fn three_frames() -> (Vec<u8>, Vec<usize>) {
    let mut buf = Vec::new();
    let mut ends = Vec::new();
    for (offset, body) in [b"first", b"other", b"third"].iter().enumerate() {
        let meta = frame(FRAME_KIND_RECORD, 1, offset as u64, 10, None);
        frame::encode_frame(&mut buf, meta, &[], &body[..]);
        ends.push(buf.len());
    }
    (buf, ends)
}

#[test]
fn a_garbled_frame_ends_the_valid_prefix_even_before_good_ones() {
    let (mut buf, ends) = three_frames();
    // A flipped body byte of the second frame: its CRC fails, and the third frame (intact)
    // is not kept either, since the log is only trusted up to the first bad frame.
    buf[ends[1] - 2] ^= 0xff;
    assert_eq!(frame::valid_prefix_len(&buf), ends[0]);
    let bytes = bytes::Bytes::copy_from_slice(&buf[..ends[0]]);
    let record = index_segment("segments/t.seg".into(), &bytes);
    assert_eq!(record.size_bytes, ends[0] as u64);
    assert_eq!(record.streams[0].runs.len(), 1);
    assert_eq!(record.streams[0].runs[0].next_offset, 1);
}

#[test]
fn a_torn_or_zeroed_tail_is_cut_at_the_last_whole_frame() {
    let (buf, ends) = three_frames();
    for cut in ends[1] + 1..ends[2] {
        assert_eq!(
            frame::valid_prefix_len(&buf[..cut]),
            ends[1],
            "cut at {cut}"
        );
    }
    // A pre-allocated file: zeros after the last frame.
    let mut zeroed = buf.clone();
    zeroed.resize(buf.len() + 8192, 0);
    assert_eq!(frame::valid_prefix_len(&zeroed), ends[2]);
    // Garbage where a header should be (a length no frame can have).
    let mut garbage = buf[..ends[0]].to_vec();
    garbage.extend_from_slice(&[0xff; 64]);
    assert_eq!(frame::valid_prefix_len(&garbage), ends[0]);
}

#[test]
fn an_index_of_nothing_is_empty() {
    let record = index_segment("segments/e.seg".into(), &bytes::Bytes::new());
    assert!(record.streams.is_empty());
    assert_eq!(record.size_bytes, 0);
}
