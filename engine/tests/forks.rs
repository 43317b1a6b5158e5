//! Forks through the typed `CoreHandle` on two cores: a fork's create resolves its fork point
//! with the source wherever it lives, a read of the fork is stitched from the source's records
//! below the fork point and its own after it, and a fork of a missing source is refused.

mod common;

use bytes::Bytes;
use common::{append_request, create_request, record, run_returning};
use pico_engine::{CreateError, CreateRequest, EngineError, ForkSpec, TrimError};

fn fork_of(source: &str, offset: Option<u64>) -> CreateRequest {
    CreateRequest {
        fork: Some(ForkSpec {
            source: source.into(),
            offset,
            offset_bytes: 0,
            sub_offset: 0,
        }),
        // Empty: the source's content type.
        ..create_request("")
    }
}

#[test]
fn forks_read_their_source_below_the_fork_point_and_their_own_records_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let config = common::config(&path, 2);
    let (answers, missing) = run_returning(config, &path, move |core, _| async move {
        core.create("/src", create_request("text/plain"))
            .await
            .unwrap();
        for body in ["a", "b", "c"] {
            let request = append_request(vec![record(body)], false);
            core.append("/src", request).await.unwrap();
        }
        let mut answers = Vec::new();
        // Several forks, so both cores serve some of them (placement is by name).
        for i in 0..4 {
            let name = format!("/fork/{i}");
            let created = core.create(&name, fork_of("/src", Some(2))).await.unwrap();
            let own = append_request(vec![record(format!("own-{i}"))], false);
            let ack = core.append(&name, own).await.unwrap();
            let bodies: Vec<Bytes> = common::read_all(&core, &name, 1 << 20)
                .await
                .into_iter()
                .map(|r| r.body)
                .collect();
            answers.push((
                created.created,
                created.info.content_type,
                ack.start_offset,
                bodies,
            ));
        }
        let missing = core.create("/fork/x", fork_of("/nothing", None)).await;
        (answers, missing.map(|c| c.created))
    });
    for (i, (created, content_type, own_offset, bodies)) in answers.into_iter().enumerate() {
        assert!(created);
        assert_eq!(content_type, "text/plain", "a fork takes its source's type");
        assert_eq!(
            own_offset,
            Some(2),
            "a fork's own records start at its fork point"
        );
        let want: Vec<Bytes> = vec!["a".into(), "b".into(), format!("own-{i}").into()];
        assert_eq!(bodies, want);
    }
    assert!(
        matches!(missing, Err(CreateError::Engine(EngineError::NotFound))),
        "{missing:?}"
    );
}

/// A trim of a source that live forks read through is refused (the forks keep reading what
/// they inherited, and a restart finds it too); once the forks are gone, the trim goes ahead.
/// Before, the trim succeeded, the forks lost their inherited records, and the garbage
/// collector deleted the objects.
#[test]
fn a_source_that_forks_read_is_not_trimmed_while_they_exist() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let config = common::config(&path, 2);
    let (refused, inherited, after_delete) =
        run_returning(config, &path, move |core, _| async move {
            core.create("/tsrc", create_request("text/plain"))
                .await
                .unwrap();
            for body in ["a", "b", "c", "d"] {
                let request = append_request(vec![record(body)], false);
                core.append("/tsrc", request).await.unwrap();
            }
            core.create("/tfork", fork_of("/tsrc", Some(3)))
                .await
                .unwrap();
            let refused = core.trim("/tsrc", 2).await;
            let inherited: Vec<Bytes> = common::read_all(&core, "/tfork", 1 << 20)
                .await
                .into_iter()
                .map(|r| r.body)
                .collect();
            core.delete("/tfork").await.unwrap();
            // The fork's release reaches the source's core after the delete's answer.
            let mut after_delete = core.trim("/tsrc", 2).await;
            for _ in 0..200 {
                if !matches!(after_delete, Err(TrimError::ReadByForks { .. })) {
                    break;
                }
                glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
                after_delete = core.trim("/tsrc", 2).await;
            }
            (refused, inherited, after_delete)
        });
    assert!(
        matches!(refused, Err(TrimError::ReadByForks { forks: 1 })),
        "{refused:?}"
    );
    let want: Vec<Bytes> = vec!["a".into(), "b".into(), "c".into()];
    assert_eq!(inherited, want, "the fork still reads what it inherited");
    assert_eq!(
        after_delete.unwrap(),
        2,
        "without forks the trim goes ahead"
    );
}

/// A source deleted while forks read it keeps its name until its last fork is deleted, and no
/// longer: the last fork's delete gives the reference back before it is answered, so the name
/// can be created again at once. Before, the release ran after the answer and the name stayed
/// taken (`Gone`) for up to a second. Forks on both cores (placement is by name).
#[test]
fn a_deleted_source_is_gone_once_its_last_fork_delete_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let config = common::config(&path, 2);
    let results = run_returning(config, &path, move |core, _| async move {
        let mut results = Vec::new();
        for round in 0..4 {
            let source = format!("/source-{round}");
            core.create(&source, create_request("text/plain"))
                .await
                .unwrap();
            core.append(&source, append_request(vec![record("a")], false))
                .await
                .unwrap();
            let forks: Vec<String> = (0..3).map(|i| format!("/fork-{round}-{i}")).collect();
            for fork in &forks {
                core.create(fork, fork_of(&source, None)).await.unwrap();
            }
            core.delete(&source).await.unwrap();
            let while_forked = core.create(&source, create_request("text/plain")).await;
            for fork in &forks {
                core.delete(fork).await.unwrap();
            }
            let after = core.create(&source, create_request("text/plain")).await;
            results.push((
                while_forked.map(|c| c.created).err(),
                after.map(|c| c.created),
            ));
        }
        results
    });
    for (round, (while_forked, after)) in results.into_iter().enumerate() {
        assert!(
            matches!(while_forked, Some(CreateError::ConfigMismatch { .. })),
            "round {round}: the name is taken while forks read it: {while_forked:?}"
        );
        assert_eq!(
            after,
            Ok(true),
            "round {round}: free once the forks are gone"
        );
    }
}

/// The catalog of the test engine in `path`, as the next start reads it.
fn catalog(path: &std::path::Path) -> pico_engine::meta::Snapshot {
    let url = pico_engine::meta::MetaUrl::SqliteFile(path.join("meta.db"));
    let (store, snapshot) = pico_engine::meta::MetaStore::open(&url).unwrap();
    store.shutdown();
    snapshot
}

/// Deletes the catalog rows of the forks `names` as their deletes commit them, without the
/// release of their sources that follows: what a crash between the two leaves.
fn commit_fork_deletes_without_release(path: &std::path::Path, names: &[&str]) {
    let url = pico_engine::meta::MetaUrl::SqliteFile(path.join("meta.db"));
    let (store, snapshot) = pico_engine::meta::MetaStore::open(&url).unwrap();
    let ids: Vec<u64> = snapshot
        .streams
        .iter()
        .filter(|row| names.contains(&row.name.as_str()))
        .map(|row| row.id)
        .collect();
    assert_eq!(ids.len(), names.len(), "a row for each of {names:?}");
    for id in ids {
        let deleted = futures_lite::future::block_on(store.delete_stream(id)).expect("answered");
        assert_eq!(deleted, Ok(true));
    }
    store.shutdown();
}

/// A crash between a fork's delete and its source's release (the fork's row gone from the
/// catalog, its deleted source still waiting for it there: the release is made after the
/// fork's delete commits) leaves nothing of the source at the next start: its name is free,
/// as the fork's acknowledged delete promised, and its records are no one's.
#[test]
fn a_deleted_source_whose_last_fork_was_deleted_before_a_crash_is_gone_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let config = || common::config(&path, 2);
    // Sources and forks on both cores (placement is by name).
    let sources: Vec<String> = (0..4).map(|i| format!("/source-{i}")).collect();
    let forks: Vec<String> = (0..4).map(|i| format!("/fork-{i}")).collect();
    let (s, f) = (sources.clone(), forks.clone());
    run_returning(config(), &path, move |core, _| async move {
        for (source, fork) in s.iter().zip(&f) {
            core.create(source, create_request("text/plain"))
                .await
                .unwrap();
            core.append(source, append_request(vec![record("a")], false))
                .await
                .unwrap();
            core.create(fork, fork_of(source, None)).await.unwrap();
            core.delete(source).await.unwrap();
            assert!(matches!(core.head(source).await, Err(EngineError::Gone)));
        }
    });
    let fork_names: Vec<&str> = forks.iter().map(String::as_str).collect();
    commit_fork_deletes_without_release(&path, &fork_names);

    let (s, f) = (sources.clone(), forks.clone());
    let after = run_returning(config(), &path, move |core, _| async move {
        let mut after = Vec::new();
        for (source, fork) in s.iter().zip(&f) {
            let head = core.head(source).await.map(|info| info.next_offset);
            let fork_head = core.head(fork).await.map(|info| info.next_offset);
            let created = core
                .create(source, create_request("text/plain"))
                .await
                .map(|c| c.created);
            after.push((head, fork_head, created));
        }
        after
    });
    for (source, (head, fork_head, created)) in sources.iter().zip(after) {
        assert!(
            matches!(fork_head, Err(EngineError::NotFound)),
            "{source}'s fork is deleted: {fork_head:?}"
        );
        assert!(
            matches!(head, Err(EngineError::NotFound)),
            "{source} went with its last fork: {head:?}"
        );
        assert_eq!(created, Ok(true), "{source}'s name is free again");
    }
    // The sources are gone from the catalog too.
    let snapshot = catalog(&path);
    let left: Vec<&str> = snapshot
        .streams
        .iter()
        .filter(|row| row.soft_deleted)
        .map(|row| row.name.as_str())
        .collect();
    assert!(
        left.is_empty(),
        "deleted sources left in the catalog: {left:?}"
    );
}

/// The same crash in a chain: a source, a fork of it and a fork of that fork, the source and
/// the middle fork deleted (both kept for the last fork), then the last fork's delete
/// committed without its release. The next start removes the middle fork, whose release then
/// removes the source; and a source another fork still reads stays, readable through it.
#[test]
fn a_chain_of_deleted_forks_goes_after_a_crash_and_a_source_still_read_stays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let config = || common::config(&path, 2);
    run_returning(config(), &path, move |core, _| async move {
        core.create("/chain", create_request("text/plain"))
            .await
            .unwrap();
        core.append("/chain", append_request(vec![record("a")], false))
            .await
            .unwrap();
        core.create("/chain-1", fork_of("/chain", None))
            .await
            .unwrap();
        core.create("/chain-2", fork_of("/chain-1", None))
            .await
            .unwrap();
        // A second fork of the source, kept: the source must stay for it.
        core.create("/kept", create_request("text/plain"))
            .await
            .unwrap();
        core.append("/kept", append_request(vec![record("k")], false))
            .await
            .unwrap();
        core.create("/kept-1", fork_of("/kept", None))
            .await
            .unwrap();
        core.create("/kept-2", fork_of("/kept", None))
            .await
            .unwrap();
        for name in ["/chain", "/chain-1", "/kept"] {
            core.delete(name).await.unwrap();
        }
    });
    commit_fork_deletes_without_release(&path, &["/chain-2", "/kept-1"]);

    let (middle, source, kept, kept_fork) =
        run_returning(config(), &path, move |core, _| async move {
            let middle = core.head("/chain-1").await.map(|i| i.next_offset);
            // The source goes with the middle fork's release, made by the node's release task
            // right after the start.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let source = loop {
                let head = core.head("/chain").await.map(|i| i.next_offset);
                if !matches!(head, Err(EngineError::Gone)) || std::time::Instant::now() > deadline {
                    break head;
                }
                glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
            };
            let kept = core.head("/kept").await.map(|i| i.next_offset);
            let read = core
                .read("/kept-2", &common::page_request(0, 10, 1 << 20))
                .await
                .map(|batch| batch.records.len());
            (middle, source, kept, read)
        });
    assert!(matches!(middle, Err(EngineError::NotFound)), "{middle:?}");
    assert!(matches!(source, Err(EngineError::NotFound)), "{source:?}");
    assert!(
        matches!(kept, Err(EngineError::Gone)),
        "a deleted source a fork still reads stays for it: {kept:?}"
    );
    assert_eq!(kept_fork, Ok(1), "and the fork reads its record");
}
