//! The append hot path allocates per request, never per record: decoding a binary batch slices
//! the request body (one `Vec` for the records), and framing records into a segment buffer
//! that has room allocates nothing. Counted with a counting global allocator; one test in this
//! binary, so no other test thread allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use pico_engine::frame::{self, FrameMeta, FRAME_KIND_RECORD};
use pico_net::codec::decode_binary_batch;
use pico_proto::batch::VERSION as BINARY_VERSION;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds
// `GlobalAlloc`'s contract; the counter is a relaxed atomic and allocates nothing itself.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout goes to `System` as given.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout (every allocation does).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; `new_size` is the caller's, unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations_during<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let value = work();
    (value, ALLOCATIONS.load(Ordering::Relaxed) - before)
}

/// A binary batch of `count` records of `size` bytes, no headers (`pico bench`'s shape).
fn batch(count: usize, size: usize) -> Bytes {
    let mut body = vec![BINARY_VERSION];
    body.extend_from_slice(&(count as u32).to_be_bytes());
    for i in 0..count {
        body.extend_from_slice(&0u32.to_be_bytes());
        body.extend_from_slice(&(size as u32).to_be_bytes());
        body.extend(std::iter::repeat_n(i as u8, size));
    }
    Bytes::from(body)
}

#[test]
fn the_append_path_allocates_per_request_not_per_record() {
    for count in [1, 100, 1000] {
        // As the HTTP layer hands it over: one shared buffer per request body.
        let body = batch(count, 1024);
        let _warm = body.slice(0..1);
        let (records, allocations) = allocations_during(|| {
            decode_binary_batch(&body, pico_engine::limits::RECORDS_PER_APPEND_MAX).unwrap()
        });
        assert_eq!(records.len(), count);
        assert!(
            allocations <= 1,
            "decoding {count} records allocated {allocations} times"
        );
        assert_eq!(
            records[count - 1].body[0],
            (count - 1) as u8,
            "sliced, not copied"
        );

        let mut segment = Vec::with_capacity(8 * 1024 * 1024);
        let ((), allocations) = allocations_during(|| {
            for (i, record) in records.iter().enumerate() {
                let meta = FrameMeta {
                    kind: FRAME_KIND_RECORD,
                    stream_id: 7,
                    offset: i as u64,
                    timestamp_ms: 1,
                    request_end: i + 1 == records.len(),
                    producer: None,
                    writer_seq: None,
                };
                frame::encode_frame(&mut segment, meta, &record.headers, &record.body);
            }
        });
        assert_eq!(allocations, 0, "framing {count} records allocated");
        assert_eq!(frame::valid_prefix_len(&segment), segment.len());
    }
}
