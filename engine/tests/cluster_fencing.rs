//! A cluster node's appends whose segment commit is refused (the streams moved to another
//! node while the segment's PUT was slow) are never acknowledged: one engine core on a real
//! Postgres catalog and a `file://` bucket whose PUT is held, with the streams moved away
//! through the metadata log the way another node's hand-off would.
//!
//! Needs `PICOMQ_PG_URL` (`scripts/pg-up.sh`); without it the test prints a skip note, or
//! fails under `CI=true`.

mod common;

use std::rc::Rc;
use std::time::{Duration, Instant};

use common::{append_request, create_request, record};
use pico_engine::meta::testing::PgDatabase;
use pico_engine::meta::Fence;
use pico_engine::{
    boot, AppendError, AppendRequest, ClusterConfig, CoreHandle, CreateRequest, EngineConfig,
    EngineError, NotOwnerReason,
};

const NODE: u32 = 1;
const OTHER: u32 = 2;
/// Long enough that this node's keeper does not renew (and revalidate) during the test: the
/// refused commit, not the revalidation, must be what fails the appends.
const LEASE_MS: u64 = 120_000;
/// Bounds every wait of the test (never a margin the assertions depend on).
const WAIT_BOUND: Duration = Duration::from_secs(60);

/// Boots node `NODE` as incarnation `node_epoch` on `db`, one core in `dir`, with a lease too
/// long to renew during a test.
fn boot_node(
    db: &PgDatabase,
    dir: &std::path::Path,
    node_epoch: u64,
    durability: pico_engine::Durability,
    segment_max_age_ms: u64,
) -> pico_engine::Boot {
    let objects = dir.join("objects");
    boot_node_at(
        db.url(),
        dir,
        &objects,
        node_epoch,
        durability,
        segment_max_age_ms,
        LEASE_MS,
    )
    .expect("boot")
}

/// [`boot_node`] on the metadata log at `meta_url` and the bucket `objects`, with a lease of
/// `lease_ms`.
fn boot_node_at(
    meta_url: &str,
    dir: &std::path::Path,
    objects: &std::path::Path,
    node_epoch: u64,
    durability: pico_engine::Durability,
    segment_max_age_ms: u64,
    lease_ms: u64,
) -> Result<pico_engine::Boot, pico_engine::BootError> {
    let config = EngineConfig {
        durability,
        segment_size: 1024 * 1024,
        segment_max_age_ms,
        node_id: Some(NODE),
        ..common::config(dir, 1)
    };
    let cluster = ClusterConfig {
        node_id: NODE,
        node_epoch,
        address: "http://127.0.0.1:9".into(),
        slots: 1,
        lease_ms,
        redirect: true,
        cluster_id: "fencing".into(),
    };
    let storage = format!("-2@file://{}", objects.display());
    boot(config, meta_url, &storage, Some(cluster))
}

fn create() -> CreateRequest {
    create_request("text/plain")
}

fn append(body: &str) -> AppendRequest {
    append_request(vec![record(body.to_owned())], false)
}

/// Where an append landed: its first offset, or its error in words.
fn landed(ack: &Result<pico_engine::AppendAck, AppendError>) -> Result<Option<u64>, String> {
    ack.as_ref()
        .map(|a| a.start_offset)
        .map_err(|e| e.to_string())
}

/// `(offset, body)` pairs with the bodies as text.
fn texts(bodies: Vec<(u64, bytes::Bytes)>) -> Vec<(u64, String)> {
    bodies
        .into_iter()
        .map(|(offset, body)| (offset, String::from_utf8_lossy(&body).into_owned()))
        .collect()
}

/// Waits (bounded) until a PUT of `store` is held by `hold_next_put`.
async fn until_put_held(store: &pico_s3::ObjectStore) {
    let deadline = Instant::now() + WAIT_BOUND;
    while !store.faults().put_is_held() {
        assert!(Instant::now() < deadline, "the segment's PUT was not held");
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
}

#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn no_append_of_a_segment_refused_at_commit_is_acknowledged() {
    let Some(db) = PgDatabase::create("engine_refused_commit") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node_epoch = pico_engine::now_ms() as u64;
    let booted = boot_node(
        &db,
        dir.path(),
        node_epoch,
        pico_engine::Durability::Object,
        20,
    );
    let (meta, store) = (booted.meta.clone(), booted.store.clone());
    let seed = booted.seeds.into_iter().next().expect("one core");
    let names = ["/fenced/a", "/fenced/b", "/fenced/c"];
    let answers = common::executor()
        .spawn(move || async move {
            let core: Rc<CoreHandle> = CoreHandle::start(seed).await.expect("core starts");
            for name in names {
                core.create(name, create()).await.expect("created");
            }
            meta.register_node(OTHER, node_epoch, "http://127.0.0.1:10", 1, LEASE_MS)
                .await
                .expect("answered")
                .expect("node 2 registered");
            // One segment holds an append to each stream; its PUT waits.
            store.faults().hold_next_put();
            let tasks: Vec<_> = names
                .iter()
                .map(|&name| {
                    let core = core.clone();
                    glommio::spawn_local(async move {
                        let answer = core.append(name, append(name)).await;
                        let answer = answer.map(|_| ()).map_err(|e| match e {
                            AppendError::Engine(EngineError::NotOwner(m)) => {
                                format!("not owner: {m}")
                            }
                            other => format!("unexpected: {other}"),
                        });
                        (name, answer)
                    })
                })
                .collect();
            until_put_held(&store).await;
            // Each stream moves to node 2 the way a hand-off records it.
            for name in names {
                let (row, ownership) = meta
                    .lookup_stream(name)
                    .await
                    .expect("answered")
                    .expect("looked up")
                    .expect("registered");
                assert_eq!(ownership.node, Some(NODE));
                meta.request_transfer(name, OTHER)
                    .await
                    .expect("answered")
                    .expect("transfer recorded");
                let fence = Fence {
                    node: NODE,
                    node_epoch,
                    epoch: ownership.epoch,
                };
                meta.complete_transfer(row.id, fence, OTHER)
                    .await
                    .expect("answered")
                    .expect("moved");
            }
            store.faults().release_held_put();
            let mut answers = Vec::new();
            for task in tasks {
                answers.push(task.await);
            }
            answers
        })
        .expect("executor")
        .join()
        .expect("join");
    assert_eq!(answers.len(), names.len());
    for (name, answer) in &answers {
        // Every stream's append fails, not only the first's: forgetting that one must not
        // release the segment's other acknowledgements as stored.
        assert!(
            answer.as_ref().is_err_and(|e| e.starts_with("not owner")),
            "{name}: {answer:?} (every answer: {answers:?})"
        );
    }
    booted.meta.shutdown();
}

/// A replacement registered under the same node id (a newer `--node-epoch`) while this
/// incarnation still runs, with one of its segment PUTs in flight: the old incarnation's
/// commit is refused and its append fails, and its metadata writes (a delete) are refused
/// too. Before, node-id fencing let both incarnations commit and acknowledge the same offsets.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn a_superseded_incarnation_commits_and_acknowledges_nothing() {
    let Some(db) = PgDatabase::create("engine_superseded_incarnation") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node_epoch = pico_engine::now_ms() as u64;
    let booted = boot_node(
        &db,
        dir.path(),
        node_epoch,
        pico_engine::Durability::Object,
        20,
    );
    let (meta, store) = (booted.meta.clone(), booted.store.clone());
    let seed = booted.seeds.into_iter().next().expect("one core");
    let (appended, deleted, stored) = common::executor()
        .spawn(move || async move {
            let core: Rc<CoreHandle> = CoreHandle::start(seed).await.expect("core starts");
            core.create("/inc/a", create()).await.expect("created");
            core.create("/inc/b", create()).await.expect("created");
            store.faults().hold_next_put();
            let writer = {
                let core = core.clone();
                glommio::spawn_local(async move { core.append("/inc/a", append("old")).await })
            };
            until_put_held(&store).await;
            // The replacement registers: same id, newer epoch.
            let state = meta
                .register_node(NODE, node_epoch + 1, "http://127.0.0.1:11", 1, LEASE_MS)
                .await
                .expect("answered")
                .expect("the replacement registered");
            assert!(
                state.previous_lease_left_ms > 0,
                "the old incarnation's lease was still running"
            );
            store.faults().release_held_put();
            let appended = writer.await;
            let deleted = core.delete("/inc/b").await;
            let stored = meta
                .lookup_stream("/inc/a")
                .await
                .expect("answered")
                .expect("looked up");
            (appended, deleted, stored)
        })
        .expect("executor")
        .join()
        .expect("join");
    assert!(
        matches!(appended, Err(AppendError::Engine(EngineError::NotOwner(_)))),
        "the old incarnation's append: {appended:?}"
    );
    assert!(
        matches!(deleted, Err(EngineError::NotOwner(NotOwnerReason::Fenced(ref m))) if m.contains("superseded")),
        "the old incarnation's delete: {deleted:?}"
    );
    let (row, _) = stored.expect("the stream is still registered");
    let load = futures_lite::future::block_on(booted.meta.load_stream(row.id))
        .expect("answered")
        .expect("loaded")
        .expect("the stream's row");
    let entries: usize = load.snapshot.segments.iter().map(|s| s.streams.len()).sum();
    assert_eq!(
        entries, 0,
        "nothing of the old incarnation's append was committed"
    );
    booted.meta.shutdown();
}

/// A replacement (same node id, newer epoch) that starts while the incarnation before it still
/// commits and acknowledges: whatever that one acknowledged before the replacement registered
/// is in the replacement's streams, and the replacement's own appends come after it. The
/// replacement's registration is held back (the Postgres fault proxy) after it connected, and
/// the old incarnation acknowledges an append meanwhile. Before, the replacement read the
/// catalog before registering, missed that append and handed its offset out again (the fault
/// test saw it after a `kill -9` whose last COMMIT was still on its way).
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn a_replacement_serves_what_the_incarnation_before_it_acknowledged_while_it_started() {
    use pico_testkit::pg_proxy::{Fault, PgProxy};
    let Some(db) = PgDatabase::create("engine_replacement_reads_after_registering") else {
        return;
    };
    // Short, so that the replacement waits out the old incarnation's lease quickly.
    const SHORT_LEASE_MS: u64 = 1_000;
    let old_dir = tempfile::tempdir().unwrap();
    let new_dir = tempfile::tempdir().unwrap();
    // One bucket for both incarnations, as a node's restart on the same storage has.
    let objects = old_dir.path().join("objects");
    let (proxy, proxied_url) = PgProxy::in_front_of(db.url()).expect("start the Postgres proxy");
    let proxy = std::sync::Arc::new(proxy);
    let node_epoch = pico_engine::now_ms() as u64;
    let old = boot_node_at(
        db.url(),
        old_dir.path(),
        &objects,
        node_epoch,
        pico_engine::Durability::Object,
        20,
        SHORT_LEASE_MS,
    )
    .expect("the old incarnation boots");
    let seed = old.seeds.into_iter().next().expect("one core");
    let new_path = new_dir.path().to_path_buf();
    let held = proxy.clone();
    let (before, during, new) = common::executor()
        .spawn(move || async move {
            let core: Rc<CoreHandle> = CoreHandle::start(seed).await.expect("core starts");
            core.create("/restart/a", create()).await.expect("created");
            let before = core.append("/restart/a", append("before")).await;
            // The replacement's registration (it locks its node's row) waits at the proxy.
            held.inject(Fault::DelayStatementsFrom(
                "FROM nodes WHERE node_id = $1 FOR UPDATE",
                WAIT_BOUND,
            ));
            let replacement = std::thread::spawn(move || {
                boot_node_at(
                    &proxied_url,
                    &new_path,
                    &objects,
                    node_epoch + 1,
                    pico_engine::Durability::Object,
                    20,
                    SHORT_LEASE_MS,
                )
            });
            let deadline = Instant::now() + WAIT_BOUND;
            while held.delays_started() == 0 {
                assert!(
                    Instant::now() < deadline,
                    "the replacement did not come to register"
                );
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
            let during = core.append("/restart/a", append("during")).await;
            held.heal();
            while !replacement.is_finished() {
                assert!(Instant::now() < deadline, "the replacement did not boot");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
            (before, during, replacement.join().expect("the boot thread"))
        })
        .expect("executor")
        .join()
        .expect("join");
    assert_eq!(landed(&before), Ok(Some(0)));
    assert_eq!(
        landed(&during),
        Ok(Some(1)),
        "the old incarnation acknowledges while the replacement is not registered yet"
    );
    let new = new.expect("the replacement boots");
    let seed = new.seeds.into_iter().next().expect("one core");
    let (after, bodies) = common::executor()
        .spawn(move || async move {
            let core: Rc<CoreHandle> = CoreHandle::start(seed).await.expect("core starts");
            let after = core.append("/restart/a", append("after")).await;
            (
                after,
                common::read_bodies(&core, "/restart/a", 1 << 20).await,
            )
        })
        .expect("executor")
        .join()
        .expect("join");
    assert_eq!(
        landed(&after),
        Ok(Some(2)),
        "the replacement's first append comes after everything acknowledged before it"
    );
    assert_eq!(
        texts(bodies),
        [
            (0, "before".into()),
            (1, "during".into()),
            (2, "after".into())
        ]
    );
    new.meta.shutdown();
    old.meta.shutdown();
}

/// A fenced metadata write whose outcome stays unknown (its COMMIT went through, the answer was
/// lost and Postgres stayed out of reach while the node asked) makes the core let the stream go
/// and read it back from the catalog before it takes anything. An append already on its way
/// then (its segment's PUT held) is answered by its segment's commit, and the stream is read
/// back only once that commit is done: nothing after it takes its offset. Before, the append
/// was failed as "not appended" although its segment committed later, and the stream, read
/// back before that commit, handed its offset to the next append: two committed segments
/// claimed one offset, and a restart served the first in place of the acknowledged second.
/// Takes about 30 s: the node asks that long whether the COMMIT went through.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn appends_on_their_way_when_a_stream_is_let_go_keep_their_offsets() {
    use pico_testkit::pg_proxy::{Fault, PgProxy};
    let Some(db) = PgDatabase::create("engine_unknown_outcome_settles") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects");
    let (proxy, proxied_url) = PgProxy::in_front_of(db.url()).expect("start the Postgres proxy");
    let node_epoch = pico_engine::now_ms() as u64;
    let booted = boot_node_at(
        &proxied_url,
        dir.path(),
        &objects,
        node_epoch,
        pico_engine::Durability::Object,
        20,
        LEASE_MS,
    )
    .expect("boot");
    let store = booted.store.clone();
    let seed = booted.seeds.into_iter().next().expect("one core");
    let proxy = std::sync::Arc::new(proxy);
    let faults = proxy.clone();
    let (configured, answers, bodies) = common::executor()
        .spawn(move || async move {
            let core: Rc<CoreHandle> = CoreHandle::start(seed).await.expect("core starts");
            core.create("/unknown/a", create()).await.expect("created");
            let zero = core.append("/unknown/a", append("zero")).await;
            store.faults().hold_next_put();
            let one = {
                let core = core.clone();
                glommio::spawn_local(async move { core.append("/unknown/a", append("one")).await })
            };
            until_put_held(&store).await;
            // A retention change commits, its answer is lost, and the node cannot ask again.
            faults.inject(Fault::LoseCommitAnswerAfter("SET retention_age_ms"));
            faults.inject(Fault::Refuse(true));
            let change = pico_engine::RetentionChange {
                age_ms: Some(Some(86_400_000)),
                ..Default::default()
            };
            let configured = core
                .configure("/unknown/a", change)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            faults.inject(Fault::Refuse(false));
            // The next append reads the stream back from the catalog; it is refused (to retry)
            // while the node reconnects to Postgres.
            let deadline = Instant::now() + WAIT_BOUND;
            let two = {
                let core = core.clone();
                glommio::spawn_local(async move {
                    loop {
                        let answer = core.append("/unknown/a", append("two")).await;
                        let refused = matches!(
                            answer,
                            Err(AppendError::Engine(
                                EngineError::NotOwner(_) | EngineError::Storage(_)
                            ))
                        );
                        if !refused || Instant::now() >= deadline {
                            return answer;
                        }
                        glommio::timer::sleep(Duration::from_millis(100)).await;
                    }
                })
            };
            glommio::timer::sleep(Duration::from_millis(200)).await;
            store.faults().release_held_put();
            let answers = [zero, one.await, two.await];
            let bodies = common::read_bodies(&core, "/unknown/a", 1 << 20).await;
            (configured, answers, bodies)
        })
        .expect("executor")
        .join()
        .expect("join");
    assert!(
        configured
            .as_ref()
            .is_err_and(|e| e.contains("whether this change was stored is unknown")),
        "the retention change's outcome: {configured:?}"
    );
    let offsets: Vec<_> = answers.iter().map(landed).collect();
    assert_eq!(offsets, [Ok(Some(0)), Ok(Some(1)), Ok(Some(2))]);
    assert_eq!(
        texts(bodies),
        [(0, "zero".into()), (1, "one".into()), (2, "two".into())]
    );
    // What a restart reads: the catalog holds each offset once.
    let (row, _) = futures_lite::future::block_on(booted.meta.lookup_stream("/unknown/a"))
        .expect("answered")
        .expect("looked up")
        .expect("registered");
    let load = futures_lite::future::block_on(booted.meta.load_stream(row.id))
        .expect("answered")
        .expect("loaded")
        .expect("the stream's row");
    let mut runs: Vec<(u64, u64)> = load
        .snapshot
        .segments
        .iter()
        .flat_map(|segment| &segment.streams)
        .flat_map(|entry| &entry.runs)
        .map(|run| (run.first_offset, run.next_offset))
        .collect();
    runs.sort_unstable();
    let mut next = 0;
    for &(first, end) in &runs {
        assert_eq!(first, next, "the catalog's runs of the stream: {runs:?}");
        next = end;
    }
    assert_eq!(next, 3, "the catalog's runs of the stream: {runs:?}");
    booted.meta.shutdown();
}

/// Boots node `NODE` at `node_epoch` with local durability on `db`, runs `f` on its one core,
/// then stops without flushing (what a crash leaves: the appends in the WAL); the boot report.
fn crash_after<F, Fut>(db: &PgDatabase, dir: &std::path::Path, node_epoch: u64, f: F) -> Vec<String>
where
    F: FnOnce(Rc<CoreHandle>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let booted = boot_node(db, dir, node_epoch, pico_engine::Durability::Local, 600_000);
    let seed = booted.seeds.into_iter().next().expect("one core");
    common::executor()
        .spawn(move || async move {
            let core = CoreHandle::start(seed).await.expect("core starts");
            f(core).await
        })
        .expect("executor")
        .join()
        .expect("join");
    booted.meta.shutdown();
    booted.report
}

/// A cluster node's WAL records the owner epoch of its frames: a stream that another node took
/// over while this one was down, wrote to, and handed back before this one recovered is held
/// at a newer epoch, and the WAL's records of the old incarnation are not restored into it.
/// Before, recovery was fenced by node alone: the stream read both owners' records at the
/// same offsets.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn wal_records_of_an_old_incarnation_never_join_a_stream_handed_back() {
    let Some(db) = PgDatabase::create("engine_wal_owner_epoch") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let first_epoch = pico_engine::now_ms() as u64;
    crash_after(&db, dir.path(), first_epoch, |core| async move {
        core.create("/m", create()).await.expect("created");
        let ack = core.append("/m", append("a0")).await.expect("acknowledged");
        assert_eq!(ack.start_offset, Some(0));
    });
    // While node 1 is down: its lease ends, node 2 takes /m over, stores its own record at
    // offset 0, and hands /m back to node 1.
    let (other, _) =
        pico_engine::meta::MetaStore::open(&pico_engine::meta::MetaUrl::parse(db.url()).unwrap())
            .unwrap();
    wait(other.release_lease(NODE, first_epoch)).expect("lease released");
    wait(other.register_node(OTHER, 1, "http://127.0.0.1:10", 1, LEASE_MS)).expect("registered");
    let moved = wait(other.take_over(NODE, first_epoch)).expect("taken over");
    assert_eq!(moved.len(), 1, "/m moved to node 2");
    let (row, owner) = wait(other.lookup_stream("/m"))
        .expect("looked up")
        .expect("row");
    assert_eq!(owner.node, Some(OTHER));
    let theirs = pico_engine::meta::SegmentRecord {
        key: "segments/n2/theirs.seg".into(),
        size_bytes: 42,
        created_ms: 1,
        streams: vec![pico_engine::meta::SegmentStreamEntry {
            stream_id: row.id,
            runs: vec![pico_engine::meta::SegmentRun {
                first_offset: 0,
                next_offset: 1,
                byte_start: 0,
                byte_end: 42,
            }],
            last_timestamp_ms: 1,
            closed: false,
            producers: vec![],
            closed_by: None,
            writer_seq: None,
        }],
    };
    let fence = pico_engine::meta::SegmentFence {
        node: OTHER,
        node_epoch: 1,
        epochs: [(row.id, owner.epoch)].into_iter().collect(),
        quarantine_refused: false,
    };
    // Node 2 stored its object in the shared bucket before the commit, as a node does.
    let theirs_object = dir.path().join("objects/segments/n2/theirs.seg");
    std::fs::create_dir_all(theirs_object.parent().unwrap()).unwrap();
    std::fs::write(&theirs_object, [0u8; 42]).unwrap();
    assert!(wait(other.commit_segment_fenced(theirs, fence))
        .expect("stored")
        .is_empty());
    // Node 1's next incarnation registers (as its boot does, before it recovers), and /m is
    // handed back to it at once.
    wait(other.register_node(NODE, first_epoch + 1, "http://127.0.0.1:9", 1, LEASE_MS))
        .expect("node 1 registered again");
    wait(other.request_transfer("/m", NODE)).expect("transfer asked");
    let back = Fence {
        node: OTHER,
        node_epoch: 1,
        epoch: owner.epoch,
    };
    let epoch = wait(other.complete_transfer(row.id, back, NODE)).expect("handed back");
    assert!(epoch > owner.epoch);

    // That incarnation recovers its WAL (started here as the next one: the registration above
    // stood in for its own).
    wait(other.release_lease(NODE, first_epoch + 1)).expect("released");
    let report = crash_after(&db, dir.path(), first_epoch + 2, |_| async {});
    let load = wait(other.load_stream(row.id))
        .expect("loaded")
        .expect("row");
    let keys: Vec<&str> = load
        .snapshot
        .segments
        .iter()
        .map(|s| s.key.as_str())
        .collect();
    assert_eq!(
        keys,
        ["segments/n2/theirs.seg"],
        "only node 2's record holds offset 0 (report: {report:?})"
    );
    // The refused record was acknowledged: it is quarantined, the garbage collector keeps its
    // segment, and an operator can read it back and then release it.
    let quarantined = wait(other.quarantined()).expect("listed");
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    let entry = &quarantined[0];
    assert_eq!(entry.stream_id, row.id);
    assert_eq!(
        (entry.runs[0].first_offset, entry.runs[0].next_offset),
        (0, 1)
    );
    assert!(
        entry.reason.contains("owned by node 1 at epoch"),
        "{}",
        entry.reason
    );
    let garbage = wait(other.garbage_segments(i64::MAX)).expect("garbage listed");
    assert!(
        !garbage.contains(&entry.segment_key),
        "the quarantined segment is kept: {garbage:?}"
    );
    let storage = format!("-2@file://{}", dir.path().join("objects").display());
    let uri = pico_s3::StorageUri::parse(&storage).expect("a storage URI");
    let store = pico_s3::ObjectStore::open(&uri).expect("the bucket opens");
    let records = futures_lite::future::block_on(pico_engine::quarantine::export(&store, entry))
        .expect("exported");
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].offset, &records[0].body[..]), (0, &b"a0"[..]));
    assert!(wait(other.release_quarantined(&entry.segment_key, entry.stream_id)).unwrap());
    assert!(wait(other.quarantined()).unwrap().is_empty());
    let garbage = wait(other.garbage_segments(i64::MAX)).expect("garbage listed");
    assert!(
        garbage.contains(&entry.segment_key),
        "released: garbage again"
    );
    other.shutdown();
}

/// The answer to a metadata request, from outside any executor.
fn wait<T>(reply: pico_engine::meta::Reply<T>) -> Result<T, pico_engine::meta::MetaError> {
    futures_lite::future::block_on(reply).expect("answered")
}

/// A cluster node that crashed after a fork's delete committed and before its deleted source
/// was released finds the source without forks when it comes back (a node taking the family
/// over finds the same, through its hand-off): it removes the source before serving it, so
/// its name is free as the fork's acknowledged delete promised.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn a_deleted_source_whose_last_fork_was_deleted_before_a_crash_is_gone_on_the_next_incarnation() {
    let Some(db) = PgDatabase::create("engine_fork_release_crash") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let first_epoch = pico_engine::now_ms() as u64;
    crash_after(&db, dir.path(), first_epoch, |core| async move {
        core.create("/src", create()).await.expect("created");
        core.append("/src", append("a"))
            .await
            .expect("acknowledged");
        let fork = CreateRequest {
            fork: Some(pico_engine::ForkSpec {
                source: "/src".into(),
                offset: None,
                offset_bytes: 0,
                sub_offset: 0,
            }),
            ..create_request("")
        };
        core.create("/fork", fork).await.expect("forked");
        core.delete("/src").await.expect("deleted for clients");
        assert!(matches!(core.head("/src").await, Err(EngineError::Gone)));
    });
    // The fork's delete committed; the crash came before the source's release.
    let (store, snapshot) =
        pico_engine::meta::MetaStore::open(&pico_engine::meta::MetaUrl::parse(db.url()).unwrap())
            .unwrap();
    let fork_id = snapshot
        .streams
        .iter()
        .find(|row| row.name == "/fork")
        .map(|row| row.id)
        .expect("the fork's row");
    assert_eq!(wait(store.delete_stream(fork_id)), Ok(true));
    // The crashed incarnation's lease, let go as its expiry would (without the wait).
    wait(store.release_lease(NODE, first_epoch)).expect("lease released");
    store.shutdown();

    let found = std::sync::Arc::new(std::sync::Mutex::new(None));
    let out = found.clone();
    crash_after(&db, dir.path(), first_epoch + 1, move |core| async move {
        let head = core.head("/src").await.map(|info| info.next_offset);
        let created = core.create("/src", create()).await.map(|c| c.created);
        *out.lock().unwrap() = Some((head, created));
    });
    let (head, created) = found
        .lock()
        .unwrap()
        .take()
        .expect("the second incarnation ran");
    assert!(
        matches!(head, Err(EngineError::NotFound)),
        "the source went with its last fork: {head:?}"
    );
    assert_eq!(created, Ok(true), "its name is free again");
}
