//! Hot paths of the write and read side: framing a record, checking and decoding a frame, and
//! the state machine's append decision. `cargo bench -p pico-engine`.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pico_engine::frame::{self, FrameMeta, ProducerTuple, FRAME_KIND_RECORD};
use pico_engine::producers::ProducerLimits;
use pico_engine::rules::{AppendCommand, StreamConfig, StreamState};

fn meta(offset: u64, producer: Option<&ProducerTuple>) -> FrameMeta<'_> {
    FrameMeta {
        kind: FRAME_KIND_RECORD,
        stream_id: 7,
        offset,
        timestamp_ms: 1_700_000_000_000,
        request_end: true,
        producer,
        writer_seq: None,
    }
}

fn frames(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame");
    for size in [256usize, 1024, 64 * 1024] {
        let body = vec![0x5au8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("encode", size), &body, |b, body| {
            let mut out = Vec::with_capacity(size + 64);
            b.iter(|| {
                out.clear();
                frame::encode_frame(&mut out, meta(42, None), &[], body);
                std::hint::black_box(out.len())
            })
        });
        let mut encoded = Vec::new();
        frame::encode_frame(&mut encoded, meta(42, None), &[], &body);
        let encoded = Bytes::from(encoded);
        group.bench_with_input(BenchmarkId::new("decode", size), &encoded, |b, encoded| {
            b.iter(|| std::hint::black_box(frame::decode_frame(encoded, 0).unwrap().1))
        });
    }
    group.finish();
}

fn state_apply(c: &mut Criterion) {
    let config = StreamConfig {
        content_type: "text/plain".into(),
        ttl_sec: None,
        expires_at_ms: None,
        retention: Default::default(),
    };
    let producer = ProducerTuple {
        id: "writer-1".into(),
        epoch: 0,
        seq: 0,
    };
    let limits = ProducerLimits::default();
    c.bench_function("state/apply_append", |b| {
        let mut state = StreamState::new(1, config.clone(), false, 0);
        let mut now = 1_700_000_000_000i64;
        b.iter(|| {
            now += 1;
            let command = AppendCommand {
                records: 1,
                close: false,
                match_offset: None,
                producer: None,
                content_type: None,
                writer_seq: None,
                producer_limits: &limits,
            };
            std::hint::black_box(state.apply_append(command, now).unwrap())
        })
    });
    c.bench_function("state/apply_append_producer", |b| {
        let mut state = StreamState::new(1, config.clone(), false, 0);
        let mut producer = producer.clone();
        let mut now = 1_700_000_000_000i64;
        b.iter(|| {
            now += 1;
            let command = AppendCommand {
                records: 10,
                close: false,
                match_offset: None,
                producer: Some(&producer),
                content_type: None,
                writer_seq: None,
                producer_limits: &limits,
            };
            let outcome = state.apply_append(command, now).unwrap();
            producer.seq += 1;
            std::hint::black_box(outcome)
        })
    });
}

criterion_group!(benches, frames, state_apply);
criterion_main!(benches);
