//! Protocol hot paths: parsing an HTTP/1.1 request head, decoding append batches, encoding
//! read responses. `cargo bench -p pico-net`.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pico_engine::RecordView;
use pico_net::codec;

const REQUEST_HEAD: &[u8] = b"POST /streams/orders HTTP/1.1\r\nhost: 127.0.0.1:4437\r\nuser-agent: bench\r\naccept: */*\r\ncontent-type: application/vnd.picomq.batch\r\npico-producer-id: writer-1\r\npico-producer-epoch: 0\r\npico-producer-seq: 17\r\ncontent-length: 1024\r\n\r\n";

fn binary_batch(records: usize, size: usize) -> Bytes {
    let mut batch = pico_proto::batch::BatchWriter::with_capacity(records * (8 + size));
    batch.zeroed_records(records, size).unwrap();
    batch.finish()
}

fn http1_parse(c: &mut Criterion) {
    c.bench_function("http1/parse_head", |b| {
        b.iter(|| {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut request = httparse::Request::new(&mut headers);
            std::hint::black_box(request.parse(REQUEST_HEAD).unwrap())
        })
    });
}

const LIMIT: usize = pico_engine::limits::RECORDS_PER_APPEND_MAX;

fn batches(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch");
    let batch = binary_batch(100, 1024);
    group.throughput(Throughput::Elements(100));
    group.bench_function("decode_binary_100x1KiB", |b| {
        b.iter(|| std::hint::black_box(codec::decode_binary_batch(&batch, LIMIT).unwrap().len()))
    });
    let json = format!(
        "{{\"records\":[{}]}}",
        vec!["{\"body\":\"hello world\",\"headers\":{\"k\":\"v\"}}"; 100].join(",")
    );
    let json = bytes::Bytes::from(json);
    group.bench_function("decode_json_100", |b| {
        b.iter(|| std::hint::black_box(codec::decode_json_batch(&json, LIMIT).unwrap().len()))
    });
    let records: Vec<RecordView> = (0..100)
        .map(|i| RecordView {
            offset: i,
            timestamp_ms: 1_700_000_000_000,
            headers: Bytes::new(),
            body: Bytes::from(vec![b'x'; 1024]),
        })
        .collect();
    group.bench_function("encode_binary_read_100x1KiB", |b| {
        b.iter(|| std::hint::black_box(codec::encode_binary(&records).len()))
    });
    group.bench_function("encode_json_read_100x1KiB", |b| {
        b.iter(|| std::hint::black_box(codec::encode_json(&records).len()))
    });
    group.finish();
}

criterion_group!(benches, http1_parse, batches);
criterion_main!(benches);
