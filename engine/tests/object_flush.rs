//! Object durability's flushes in process, on a `file://` bucket: an append is stored and
//! acknowledged without waiting for a segment to age, concurrent appends ride one PUT, the
//! node's flush PUTs stay within `object_puts_per_second`, and what was acknowledged is read
//! back after a restart (there is no WAL to replay: only the bucket and the catalog).

mod common;

use std::time::{Duration, Instant};

use common::{append_request, create_request, read_bodies, record, run_returning};
use pico_engine::metrics::{CoreMetrics, NodeMetrics};
use pico_engine::{CoreHandle, Durability, EngineConfig};

/// Object durability on `cores` cores whose segments never seal by age or size here: only a
/// flush seals them.
fn config(dir: &std::path::Path, cores: usize, puts_per_second: u32) -> EngineConfig {
    EngineConfig {
        durability: Durability::Object,
        segment_size: 4 << 20,
        segment_max_age_ms: 3_600_000,
        object_puts_per_second: puts_per_second,
        ..common::config(dir, cores)
    }
}

fn uploads(metrics: &NodeMetrics) -> u64 {
    metrics.iter().map(|m| CoreMetrics::get(&m.uploads)).sum()
}

async fn create(core: &CoreHandle, name: &str) {
    let request = create_request("application/octet-stream");
    core.create(name, request).await.expect("create");
}

#[test]
fn a_lone_append_is_stored_without_waiting_for_the_segment_to_age() {
    let dir = tempfile::tempdir().unwrap();
    let (acked, stored) = run_returning(config(dir.path(), 1, 500), dir.path(), |core, node| {
        async move {
            create(&core, "lone").await;
            // The segment would seal by age in an hour: a flush that waited for it would
            // not answer within the minute (a bound for a stuck test, not a timing check).
            let append = core.append("lone", append_request(vec![record("one")], false));
            let ack = glommio::timer::timeout(Duration::from_secs(60), async {
                Ok(append.await.expect("append"))
            })
            .await
            .expect("acknowledged before the segment aged");
            (ack.next_offset, uploads(&node.metrics))
        }
    });
    assert_eq!(acked, 1);
    assert_eq!(stored, 1, "acknowledged once its segment was uploaded");
    let records = run_returning(
        config(dir.path(), 1, 500),
        dir.path(),
        |core, _| async move { read_bodies(&core, "lone", 1 << 20).await },
    );
    assert_eq!(records, vec![(0, bytes::Bytes::from("one"))]);
}

#[test]
fn concurrent_appends_ride_one_flush_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (offsets, stored) = run_returning(
        config(dir.path(), 1, 500),
        dir.path(),
        |core, node| async move {
            create(&core, "many").await;
            let tasks: Vec<_> = (0..200u32)
                .map(|i| {
                    let core = core.clone();
                    glommio::spawn_local(async move {
                        let request = append_request(vec![record(format!("r{i}"))], false);
                        core.append("many", request)
                            .await
                            .expect("append")
                            .start_offset
                    })
                })
                .collect();
            let mut offsets = Vec::new();
            for task in tasks {
                offsets.push(task.await);
            }
            (offsets, uploads(&node.metrics))
        },
    );
    let mut offsets: Vec<u64> = offsets.into_iter().map(|o| o.unwrap()).collect();
    offsets.sort_unstable();
    assert_eq!(offsets, (0..200).collect::<Vec<_>>());
    // Every append framed while the first PUT ran rides the next one.
    assert!(stored <= 20, "{stored} uploads for 200 concurrent appends");
    let records = run_returning(
        config(dir.path(), 1, 500),
        dir.path(),
        |core, _| async move { read_bodies(&core, "many", 1 << 20).await },
    );
    assert_eq!(records.len(), 200);
    assert!(records.iter().enumerate().all(|(i, (o, _))| *o == i as u64));
}

#[test]
fn flush_puts_stay_within_the_node_budget() {
    const PUTS_PER_SECOND: u32 = 20;
    const CORES: usize = 2;
    const APPENDS: u64 = 30;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), CORES, PUTS_PER_SECOND);
    let (stored, elapsed) = run_returning(config, dir.path(), |core, node| async move {
        // Streams on both cores, appended one at a time: each append needs a flush of its own.
        let names: Vec<String> = (0..4).map(|i| format!("budget-{i}")).collect();
        for name in &names {
            create(&core, name).await;
        }
        let started = Instant::now();
        for i in 0..APPENDS {
            let name = &names[i as usize % names.len()];
            let request = append_request(vec![record("x")], false);
            core.append(name, request).await.expect("append");
        }
        (uploads(&node.metrics), started.elapsed())
    });
    assert_eq!(stored, APPENDS, "one flush per lone append");
    // The budget lets one PUT per core go at once, then one per 1/20 s: the run cannot have
    // been quicker than that, however fast the machine.
    let slots_waited = APPENDS - CORES as u64;
    let floor = Duration::from_secs_f64(slots_waited as f64 / f64::from(PUTS_PER_SECOND));
    assert!(
        elapsed >= floor.mul_f64(0.99),
        "{APPENDS} flushes in {elapsed:?}: faster than {PUTS_PER_SECOND} PUTs/s"
    );
}
