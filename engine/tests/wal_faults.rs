//! The WAL's error paths in process, through the `fault-injection` seam (`src/faults.rs`):
//! a failed `fdatasync` or write fails the appends it carried and stops appends until a
//! restart, while reads go on; a WAL file that cannot be made (a full disk, or a ledger that
//! cannot be written) refuses only the appends the active file has no room for, and appends
//! resume once it can be made.
//! The real-disk versions (a full tmpfs, a deleted WAL directory) are in
//! `cli/tests/storage_faults.rs`.

mod common;

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::{append_request, create_request, record};
use pico_engine::faults::{self, WalIo};
use pico_engine::health::HealthState;
use pico_engine::{
    AppendError, AppendRequest, CoreHandle, CreateError, CreateRequest, EngineError, RecordInput,
    Resume,
};

const SEGMENT_BYTES: usize = 64 * 1024;

/// Runs `f` on a one-core engine in `dir` (64 KiB segments), then shuts the metadata log down;
/// what `f` returned.
fn run<T, F, Fut>(dir: &std::path::Path, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(Rc<CoreHandle>, pico_engine::metrics::NodeMetrics) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let config = common::config(dir, 1);
    assert_eq!(config.segment_size, SEGMENT_BYTES);
    common::run_returning(config, dir, move |core, node| f(core, node.metrics))
}

fn create() -> CreateRequest {
    create_with(Vec::new())
}

/// A create with `records` as its body.
fn create_with(records: Vec<RecordInput>) -> CreateRequest {
    CreateRequest {
        records,
        ..create_request("application/octet-stream")
    }
}

fn append(body: &[u8]) -> AppendRequest {
    append_request(vec![record(Bytes::copy_from_slice(body))], false)
}

/// Appends `record` to `/s` until an append is refused (at most 2,000): how many were
/// acknowledged, and the refusal.
async fn append_until_refused(core: &CoreHandle, record: &[u8]) -> (u64, Option<AppendError>) {
    let mut acked = 0u64;
    for _ in 0..2000 {
        match core.append("/s", append(record)).await {
            Ok(_) => acked += 1,
            Err(e) => return (acked, Some(e)),
        }
    }
    (acked, None)
}

async fn read_bodies(core: &CoreHandle, name: &str) -> Vec<(u64, Bytes)> {
    common::read_bodies(core, name, 64 << 20).await
}

/// What a restart finds: the stream's records, read by a fresh engine on the same files.
fn after_restart(dir: &std::path::Path, name: &'static str) -> Vec<(u64, Bytes)> {
    run(
        dir,
        move |core, _| async move { read_bodies(&core, name).await },
    )
}

fn failed_fsync_or_write_stops_appends_until_restart(io: WalIo) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let wal_dir = path.join("wal");
    let found = run(&path, move |core, metrics| async move {
        core.create("/s", create()).await.unwrap();
        core.append("/s", append(b"kept")).await.unwrap();
        faults::arm(&wal_dir, io, libc::EIO);
        let failed = core.append("/s", append(b"in doubt")).await;
        let after = core.append("/s", append(b"refused")).await;
        let reads = read_bodies(&core, "/s").await;
        let head = core.head("/s").await;
        let health = metrics[0].wal_health.state();
        let reason = metrics[0].wal_health.reason();
        // Other operations than appends are served: a create without records, a delete.
        let created = core.create("/other", create()).await;
        let deleted = core.delete("/other").await;
        // A create with a body is refused whole: no stream is left without its records.
        let with_body = create_with(vec![record(&b"body"[..])]);
        let refused_create = core.create("/with-body", with_body).await;
        let left = core.head("/with-body").await;
        assert!(
            matches!(
                refused_create,
                Err(CreateError::Append(AppendError::WritesStopped { .. }))
            ),
            "{refused_create:?}"
        );
        assert!(matches!(left, Err(EngineError::NotFound)), "{left:?}");
        (
            failed,
            after,
            reads,
            head.is_ok(),
            health,
            reason,
            created.is_ok(),
            deleted.is_ok(),
        )
    });
    let (failed, after, reads, head_ok, health, reason, created, deleted) = found;
    assert!(
        matches!(failed, Err(AppendError::Durability { ref fault, .. })
            if fault.io_error().and_then(|e| e.raw_os_error()) == Some(libc::EIO)
                && fault.to_string().contains("Input/output error")),
        "the append the failed I/O carried is failed: {failed:?}"
    );
    assert!(
        matches!(
            after,
            Err(AppendError::WritesStopped {
                until: Resume::Restart,
                ..
            })
        ),
        "later appends are refused, not retried as if durable: {after:?}"
    );
    assert_eq!(reads, vec![(0, Bytes::from_static(b"kept"))], "reads go on");
    assert!(head_ok && created && deleted);
    assert_eq!(health, HealthState::Failed);
    assert!(reason.contains("Input/output error"), "{reason}");
    // The restart reads what is on disk: the acknowledged record, and the failed one at
    // most once (its bytes may or may not have reached the disk), never the refused one.
    let found = after_restart(&path, "/s");
    assert_eq!(found[0], (0, Bytes::from_static(b"kept")));
    assert!(found.len() <= 2, "{found:?}");
    if let Some(second) = found.get(1) {
        assert_eq!(second, &(1, Bytes::from_static(b"in doubt")));
    }
}

#[test]
fn a_failed_fdatasync_fails_its_appends_and_stops_the_next_until_restart() {
    failed_fsync_or_write_stops_appends_until_restart(WalIo::Sync);
}

#[test]
fn a_failed_wal_write_fails_its_appends_and_stops_the_next_until_restart() {
    failed_fsync_or_write_stops_appends_until_restart(WalIo::Write);
}

#[test]
fn no_room_for_the_next_wal_file_refuses_only_what_the_active_file_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let wal_dir = path.join("wal");
    let found = run(&path, move |core, metrics| async move {
        core.create("/s", create()).await.unwrap();
        // The next WAL file (the spare the first commit round makes) fails with ENOSPC, at
        // every try, until disarmed.
        for _ in 0..1000 {
            faults::arm(&wal_dir, WalIo::Create, libc::ENOSPC);
        }
        let record = vec![b'r'; 4096];
        let (acked, refused) = append_until_refused(&core, &record).await;
        let degraded = (
            metrics[0].wal_health.state(),
            metrics[0].wal_health.reason(),
        );
        let reads = read_bodies(&core, "/s").await.len() as u64;
        // Space is back: the next try (at most a retry period away) makes the file.
        while faults::disarm(&wal_dir, WalIo::Create) {}
        let mut resumed = false;
        for _ in 0..200 {
            if core.append("/s", append(&record)).await.is_ok() {
                resumed = true;
                break;
            }
            glommio::timer::sleep(Duration::from_millis(50)).await;
        }
        let healed = metrics[0].wal_health.state();
        (acked, refused, degraded, reads, resumed, healed)
    });
    let (acked, refused, (state, reason), reads, resumed, healed) = found;
    // A spare that could not be made failed nothing the active file had room for: all of
    // it (its segment and 1 MiB of slack) filled first.
    // (A frame is its body and at most 128 bytes of header.)
    assert!(
        acked as usize >= (SEGMENT_BYTES + (1 << 20)) / (4096 + 128),
        "only {acked} appends before the refusal"
    );
    assert!(
        matches!(refused, Some(AppendError::OutOfSpace { ref fault })
            if fault.out_of_space() && fault.to_string().contains("No space left")),
        "{refused:?}"
    );
    assert_eq!(state, HealthState::Degraded);
    assert!(reason.contains("cannot create WAL file"), "{reason}");
    assert_eq!(reads, acked, "every acknowledged append reads back");
    assert!(
        resumed,
        "appends resume on their own once the file can be made"
    );
    assert_eq!(healed, HealthState::Ok);
    assert_eq!(after_restart(&path, "/s").len() as u64, acked + 1);
}

/// A core's WAL ledger that cannot be written (once, then for as long as the fault lasts):
/// the next WAL file is not handed out before the ledger lists it, so this is a WAL file
/// that cannot be made: only what the active file cannot hold is refused, appends resume
/// once the ledger takes writes, and the restart finds every file the ledger lists (no
/// file it listed was removed, no file made meanwhile is missing).
#[test]
fn a_ledger_that_cannot_be_written_refuses_only_what_the_active_file_cannot_hold() {
    for armed in [1, 1000] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let wal_dir = path.join("wal");
        let (acked, refused, resumed) = run(&path, move |core, _| async move {
            core.create("/s", create()).await.unwrap();
            for _ in 0..armed {
                faults::arm(&wal_dir, WalIo::Ledger, libc::ENOSPC);
            }
            let record = vec![b'l'; 4096];
            let (mut acked, refused) = append_until_refused(&core, &record).await;
            while faults::disarm(&wal_dir, WalIo::Ledger) {}
            let mut resumed = false;
            for _ in 0..200 {
                if core.append("/s", append(&record)).await.is_ok() {
                    resumed = true;
                    acked += 1;
                    break;
                }
                glommio::timer::sleep(Duration::from_millis(50)).await;
            }
            (acked, refused, resumed)
        });
        if armed > 1 {
            assert!(
                matches!(refused, Some(AppendError::OutOfSpace { ref fault })
                    if fault.to_string().contains("ledger")),
                "{refused:?}"
            );
        }
        assert!(resumed, "armed {armed}: appends resume");
        assert_eq!(
            after_restart(&path, "/s").len() as u64,
            acked,
            "armed {armed}"
        );
    }
}

/// Requests that wait for an earlier append's durability instead of writing: a producer's
/// retry of a sequence still in flight, and a repeated close. When that append's commit
/// round fails, each is answered `Durability` (as the original is) instead of waiting for
/// ever.
#[test]
fn requests_waiting_for_a_failed_round_are_answered_not_left_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let wal_dir = path.join("wal");
    let (original, retry, close, close_again) = run(&path, move |core, _| async move {
        core.create("/p", create()).await.unwrap();
        core.create("/c", create()).await.unwrap();
        let producer = pico_engine::frame::ProducerTuple {
            id: "w".into(),
            epoch: 0,
            seq: 0,
        };
        let once = || AppendRequest {
            producer: Some(producer.clone()),
            ..append(b"once")
        };
        let closing = || append_request(Vec::new(), true);
        faults::arm(&wal_dir, WalIo::Sync, libc::EIO);
        // All four are written or judged before the commit round runs: the retry and the
        // second close find their originals in flight and wait for them.
        let answers = futures_util::future::join4(
            core.append("/p", once()),
            core.append("/p", once()),
            core.append("/c", closing()),
            core.append("/c", closing()),
        );
        let timeout = glommio::timer::sleep(Duration::from_secs(30));
        match futures_util::future::select(Box::pin(answers), Box::pin(timeout)).await {
            futures_util::future::Either::Left((answers, _)) => answers,
            futures_util::future::Either::Right(_) => panic!("a request was left waiting"),
        }
    });
    for (what, answer) in [
        ("the original append", original),
        ("the producer's retry", retry),
        ("the first close", close),
        ("the repeated close", close_again),
    ] {
        assert!(
            matches!(answer, Err(AppendError::Durability { .. })),
            "{what}: {answer:?}"
        );
    }
}
