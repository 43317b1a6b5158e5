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
    let record = index_segment("segments/x.seg".into(), &bytes, crate::clock::now_ms());
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

#[test]
fn an_index_of_nothing_is_empty() {
    let record = index_segment("segments/e.seg".into(), &bytes::Bytes::new(), 0);
    assert!(record.streams.is_empty());
    assert_eq!(record.size_bytes, 0);
}
