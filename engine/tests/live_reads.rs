//! Live reads waiting at the same place share one read per core (engine/src/live.rs): one
//! waiter on the owning core however many subscribers wait, each answered with every record,
//! each at its own deadline.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use glommio::Task;
use pico_engine::metrics::{CoreMetrics, NodeMetrics};
use pico_engine::{owner_core, CoreHandle, ReadBatch, ReadError, ReadFrom, ReadRequest};

const SUBSCRIBERS: usize = 200;

/// Reads parked on the stream's owning core, over the node.
fn waiters(metrics: &NodeMetrics) -> u64 {
    metrics
        .iter()
        .map(|core| CoreMetrics::get(&core.live_reads_parked))
        .sum()
}

/// Readers waiting, over the node (what `pico_live_waiters` shows).
fn waiting_readers(metrics: &NodeMetrics) -> u64 {
    metrics
        .iter()
        .map(|core| CoreMetrics::get(&core.live_waiters))
        .sum()
}

/// Waits (at most about 20 s) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..20_000 {
        if done() {
            return;
        }
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
    panic!("still not the case after 20 s: {what}");
}

fn live(from: u64, wait_ms: u64) -> ReadRequest {
    ReadRequest {
        from: ReadFrom::Offset(from),
        max_records: 100,
        max_bytes: 1 << 20,
        wait_ms: Some(wait_ms),
        with_content_type: false,
        bound: None,
    }
}

/// A name starting with `prefix` that core `owner` of a two cores' node owns.
fn name_on(prefix: &str, owner: usize) -> String {
    (0..)
        .map(|i| format!("{prefix}-{owner}-{i}"))
        .find(|name| owner_core(name, 2) == owner)
        .unwrap()
}

/// A stream of two cores' node owned by core `owner`, with one record.
async fn stream_on(core: &CoreHandle, owner: usize) -> String {
    let name = name_on("live", owner);
    core.create(&name, create_request("text/plain"))
        .await
        .expect("create");
    append(core, &name, "first").await;
    name
}

async fn append(core: &CoreHandle, name: &str, body: &'static str) {
    let request = append_request(vec![record(Bytes::from_static(body.as_bytes()))], false);
    core.append(name, request).await.expect("append");
}

/// A subscriber reading `request` on its own task.
fn subscribe(
    core: &Rc<CoreHandle>,
    name: &str,
    request: ReadRequest,
) -> Task<Result<ReadBatch, ReadError>> {
    let (core, name) = (core.clone(), name.to_string());
    glommio::spawn_local(async move { core.read(&name, &request).await })
}

/// Every one of `readers` answers with exactly the record `body` at `offset`; their answers.
async fn each_gets(
    readers: impl IntoIterator<Item = Task<Result<ReadBatch, ReadError>>>,
    offset: u64,
    body: &'static str,
) -> Vec<ReadBatch> {
    let mut answers = Vec::new();
    for reader in readers {
        let batch = reader.await.expect("read");
        assert_eq!(
            bodies(&batch),
            vec![(offset, Bytes::from_static(body.as_bytes()))]
        );
        answers.push(batch);
    }
    answers
}

fn bodies(batch: &ReadBatch) -> Vec<(u64, Bytes)> {
    batch
        .records
        .iter()
        .map(|r| (r.offset, r.body.clone()))
        .collect()
}

/// Many subscribers at the tail of a stream this core owns and of one another core owns: one
/// waiter each on the owner, and every subscriber gets the next record.
#[test]
fn subscribers_at_one_place_wait_on_one_read_and_each_gets_the_record() {
    let dir = tempfile::tempdir().unwrap();
    run_returning(config(dir.path(), 2), dir.path(), |core, node| async move {
        for owner in [0, 1] {
            let name = stream_on(&core, owner).await;
            let readers: Vec<_> = (0..SUBSCRIBERS)
                .map(|_| subscribe(&core, &name, live(1, 60_000)))
                .collect();
            until("every subscriber waits", || {
                waiting_readers(&node.metrics) == SUBSCRIBERS as u64
            })
            .await;
            // Time for any read of its own to reach the owner (each did before).
            glommio::timer::sleep(Duration::from_millis(50)).await;
            assert_eq!(
                waiters(&node.metrics),
                1,
                "{SUBSCRIBERS} subscribers on core 0, stream owned by core {owner}"
            );
            assert_eq!(waiting_readers(&node.metrics), SUBSCRIBERS as u64);
            append(&core, &name, "second").await;
            let answers = each_gets(readers, 1, "second").await;
            // One answer, numbered so a protocol can encode it once for all of them.
            let shared_read = answers[0].shared_read;
            assert!(shared_read.is_some());
            assert!(answers.iter().all(|batch| batch.shared_read == shared_read));
            let alone = core.read(&name, &live(1, 0)).await.expect("read");
            assert_eq!(
                alone.shared_read, None,
                "a read that does not wait is its own"
            );
            until("the waiter is gone", || waiters(&node.metrics) == 0).await;
            assert_eq!(waiting_readers(&node.metrics), 0);
        }
    });
}

/// A subscriber that waits less than the read it joined answers at its own deadline; one that
/// waits longer than the read it joined keeps waiting past that read's end.
#[test]
fn each_subscriber_waits_as_long_as_it_asked() {
    let dir = tempfile::tempdir().unwrap();
    run_returning(config(dir.path(), 2), dir.path(), |core, node| async move {
        for owner in [0, 1] {
            let name = stream_on(&core, owner).await;
            // The long wait starts the shared read; the short one joins it and leaves early.
            let long = subscribe(&core, &name, live(1, 60_000));
            until("the long wait is parked", || waiters(&node.metrics) == 1).await;
            let short = core.read(&name, &live(1, 20)).await.expect("short read");
            assert!(short.records.is_empty(), "nothing was appended");
            assert_eq!(short.next_offset, 1);
            // The short wait starts the next shared read; a long one joins it and outlives it.
            let longer = {
                let (core, name) = (core.clone(), name.clone());
                glommio::spawn_local(async move {
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                    core.read(&name, &live(1, 60_000)).await
                })
            };
            let short = core.read(&name, &live(1, 30)).await.expect("short read");
            assert!(short.records.is_empty());
            // Both long waits outlived the short reads: a record ends them.
            until("the long waits are parked", || waiters(&node.metrics) >= 1).await;
            append(&core, &name, "second").await;
            each_gets([long, longer], 1, "second").await;
        }
    });
}

/// When every subscriber of a shared read leaves, the read and its waiter on the owning core
/// go too.
#[test]
fn a_read_nobody_waits_for_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    run_returning(config(dir.path(), 2), dir.path(), |core, node| async move {
        let name = stream_on(&core, 0).await;
        let readers: Vec<_> = (0..SUBSCRIBERS)
            .map(|_| subscribe(&core, &name, live(1, 60_000)))
            .collect();
        until("the subscribers wait", || waiters(&node.metrics) == 1).await;
        drop(readers);
        until("the waiter is gone", || waiters(&node.metrics) == 0).await;
        assert_eq!(waiting_readers(&node.metrics), 0);
        // A new subscriber starts a new read and gets the next record.
        let reader = subscribe(&core, &name, live(1, 60_000));
        until("the new subscriber waits", || waiters(&node.metrics) == 1).await;
        append(&core, &name, "second").await;
        each_gets([reader], 1, "second").await;
    });
}

/// Subscribers that start at the tail or at the first readable record (Durable Streams
/// `offset=now` and `offset=-1`) learn their offset first, then share the wait too.
#[test]
fn reads_from_the_tail_or_the_start_share_the_wait_too() {
    let dir = tempfile::tempdir().unwrap();
    run_returning(config(dir.path(), 2), dir.path(), |core, node| async move {
        for owner in [0, 1] {
            let name = name_on("empty", owner);
            core.create(&name, create_request("text/plain"))
                .await
                .expect("create");
            let subscribers: Vec<_> = [ReadFrom::Tail, ReadFrom::AtLeast(0)]
                .into_iter()
                .cycle()
                .take(SUBSCRIBERS)
                .map(|from| {
                    let request = ReadRequest {
                        from,
                        ..live(0, 60_000)
                    };
                    subscribe(&core, &name, request)
                })
                .collect();
            until("every subscriber waits", || {
                waiting_readers(&node.metrics) == SUBSCRIBERS as u64
            })
            .await;
            until("one read waits on the owner", || {
                waiters(&node.metrics) == 1
            })
            .await;
            append(&core, &name, "first").await;
            each_gets(subscribers, 0, "first").await;
        }
    });
}

/// An append is answered before the subscribers it wakes are: the executor runs woken tasks
/// in order, and one shared read wakes all of a core's subscribers, so a writer answered
/// after them waited for every delivery (50 ms with 10,000 subscribers).
#[test]
fn the_writer_is_answered_before_the_subscribers_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    run_returning(config(dir.path(), 2), dir.path(), |core, node| async move {
        let name = stream_on(&core, 0).await;
        let answered = Rc::new(RefCell::new(Vec::new()));
        let readers: Vec<_> = (0..SUBSCRIBERS)
            .map(|_| {
                let (core, name, answered) = (core.clone(), name.clone(), answered.clone());
                glommio::spawn_local(async move {
                    let batch = core.read(&name, &live(1, 60_000)).await;
                    answered.borrow_mut().push("subscriber");
                    batch
                })
            })
            .collect();
        until("every subscriber waits", || {
            waiting_readers(&node.metrics) == SUBSCRIBERS as u64
        })
        .await;
        let writer = {
            let (core, name, answered) = (core.clone(), name.clone(), answered.clone());
            glommio::spawn_local(async move {
                append(&core, &name, "second").await;
                answered.borrow_mut().push("writer");
            })
        };
        writer.await;
        each_gets(readers, 1, "second").await;
        let answered = answered.borrow();
        assert_eq!(answered.len(), SUBSCRIBERS + 1);
        assert_eq!(answered[0], "writer", "answered before any subscriber");
    });
}
