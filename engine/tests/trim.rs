//! A trim is seen by readers only once the metadata log has it, so a restart never brings
//! back records a reader already saw trimmed.

mod common;

use bytes::Bytes;
use common::*;

#[test]
fn a_trim_is_seen_only_once_the_metadata_log_has_it_and_a_restart_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    run(config(dir.path(), 1), dir.path(), |core| async move {
        core.create("t", create_request("text/plain"))
            .await
            .expect("create");
        for i in 0..5 {
            let request = append_request(vec![record(Bytes::from(format!("r{i}")))], false);
            core.append("t", request).await.expect("append");
        }
        let trim = {
            let core = core.clone();
            glommio::spawn_local(async move { core.trim("t", 3).await })
        };
        // The trim runs up to its metadata write; its answer comes through the reactor,
        // after this task's turn.
        futures_lite::future::yield_now().await;
        let seen = core.head("t").await.expect("head").start_offset;
        assert_eq!(seen, 0, "the start moved before the metadata log had it");
        assert_eq!(trim.await.expect("trim"), 3);
        assert_eq!(core.head("t").await.expect("head").start_offset, 3);
    });
    let start = run_returning(config(dir.path(), 1), dir.path(), |core, _| async move {
        core.head("t").await.expect("head").start_offset
    });
    assert_eq!(start, 3, "the trim survives a restart");
}
