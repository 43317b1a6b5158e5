//! The object store against a real temporary directory (and the in-memory bucket): the object
//! operations, key rules, concurrency, injected faults and shutdown.

use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use bytes::Bytes;
use futures_lite::future::block_on;
use pico_s3::ObjectStore;
use pico_s3::ObjectStoreOptions;
use pico_s3::StorageLocation;
use pico_s3::StorageUri;
use pico_s3::StoreError;

fn file_store(root: &Path) -> ObjectStore {
    let uri = StorageUri {
        bucket_id: -2,
        location: StorageLocation::File(root.to_path_buf()),
    };
    ObjectStore::open(&uri).expect("open file bucket")
}

/// Awaits a reply: the outer error would mean the thread dropped the answer, which it never may.
fn wait<T>(reply: pico_s3::Reply<T>) -> Result<T, StoreError> {
    block_on(reply).expect("the upload thread answers every request")
}

/// The object operations, run against both backends: they must behave the same.
fn exercise(store: &ObjectStore) {
    wait(store.put("segments/0002.seg", Bytes::from_static(b"second segment"))).unwrap();
    wait(store.put("segments/0001.seg", Bytes::from_static(b"0123456789"))).unwrap();
    wait(store.put("wal/node-1/a", Bytes::new())).unwrap();
    wait(store.put("top", Bytes::from_static(b"t"))).unwrap();

    assert_eq!(
        wait(store.get("segments/0001.seg", usize::MAX)).unwrap(),
        "0123456789"
    );
    assert_eq!(wait(store.get("wal/node-1/a", usize::MAX)).unwrap(), "");
    assert_eq!(
        wait(store.get_range("segments/0001.seg", 2, 5)).unwrap(),
        "234"
    );
    assert_eq!(
        wait(store.get_range("segments/0001.seg", 0, 10)).unwrap(),
        "0123456789"
    );
    assert_eq!(
        wait(store.get_range("segments/0001.seg", 10, 10)).unwrap(),
        ""
    );

    match wait(store.get_range("segments/0001.seg", 5, 11)) {
        Err(error @ StoreError::Short { size: 10, .. }) => {
            let message = error.to_string();
            assert!(message.contains("past the end"), "{message}");
            assert!(message.contains("10 bytes"), "{message}");
        }
        other => panic!("range past the end gave {other:?}"),
    }
    assert!(matches!(
        wait(store.get_range("segments/0001.seg", 5, 4)),
        Err(StoreError::Io(_))
    ));
    assert!(
        matches!(wait(store.get("segments/none", usize::MAX)), Err(StoreError::NotFound(key)) if key == "segments/none")
    );
    assert!(matches!(
        wait(store.get_range("nothing", 0, 1)),
        Err(StoreError::NotFound(_))
    ));
    // A key prefix is not an object.
    assert!(matches!(
        wait(store.get("segments", usize::MAX)),
        Err(StoreError::NotFound(_))
    ));

    // Overwrite replaces the whole object, shorter or longer.
    wait(store.put("segments/0002.seg", Bytes::from_static(b"v2"))).unwrap();
    assert_eq!(
        wait(store.get("segments/0002.seg", usize::MAX)).unwrap(),
        "v2"
    );

    let all = wait(store.list("")).unwrap();
    let expected = [
        ("segments/0001.seg", 10),
        ("segments/0002.seg", 2),
        ("top", 1),
        ("wal/node-1/a", 0),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(key, size)| (key.to_string(), *size))
        .collect();
    assert_eq!(all, expected);
    assert_eq!(
        wait(store.list("segments/")).unwrap(),
        expected[..2].to_vec()
    );
    assert_eq!(
        wait(store.list("segments/0001")).unwrap(),
        expected[..1].to_vec()
    );
    assert_eq!(wait(store.list("seg")).unwrap(), expected[..2].to_vec());
    assert_eq!(wait(store.list("w")).unwrap(), expected[3..].to_vec());
    assert_eq!(wait(store.list("nothing/")).unwrap(), vec![]);

    wait(store.delete("segments/0001.seg")).unwrap();
    wait(store.delete("segments/0001.seg")).unwrap(); // missing is fine
    wait(store.delete("never/existed")).unwrap();
    assert!(matches!(
        wait(store.get("segments/0001.seg", usize::MAX)),
        Err(StoreError::NotFound(_))
    ));
    let keys: Vec<_> = wait(store.list(""))
        .unwrap()
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(keys, ["segments/0002.seg", "top", "wal/node-1/a"]);
}

#[test]
fn file_bucket_operations() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("nested").join("objects");
    let store = file_store(&root);
    assert!(root.is_dir(), "open creates the root");
    exercise(&store);
    store.shutdown();

    // The objects are plain files under the root, and no temporary file is left behind.
    assert_eq!(
        std::fs::read(root.join("segments/0002.seg")).unwrap(),
        b"v2"
    );
    let leftovers: Vec<_> = std::fs::read_dir(root.join("segments"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with(".pico-tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Reopening finds what was stored.
    let store = file_store(&root);
    assert_eq!(wait(store.get("top", usize::MAX)).unwrap(), "t");
}

#[test]
fn memory_bucket_operations_and_sharing_by_name() {
    let uri = StorageUri::parse("9@mem://tests-memory-bucket").unwrap();
    let store = ObjectStore::open(&uri).unwrap();
    exercise(&store);
    store.shutdown();
    let again = ObjectStore::open(&uri).unwrap();
    assert_eq!(
        wait(again.get("top", usize::MAX)).unwrap(),
        "t",
        "same name, same objects"
    );
    let other =
        ObjectStore::open(&StorageUri::parse("9@mem://tests-other-bucket").unwrap()).unwrap();
    assert!(matches!(
        wait(other.get("top", usize::MAX)),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn list_skips_temporary_files_and_foreign_entries() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(dir.path());
    wait(store.put("segments/a", Bytes::from_static(b"a"))).unwrap();
    // What a crash mid-put leaves behind.
    std::fs::write(dir.path().join("segments/.pico-tmp.b.1.0"), b"torn").unwrap();
    let listed = wait(store.list("")).unwrap();
    assert_eq!(listed, vec![("segments/a".to_string(), 1)]);
}

#[test]
fn bad_keys_are_refused_without_touching_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("objects");
    let store = file_store(&root);
    for key in [
        "",
        "/etc/passwd",
        "../escape",
        "a/../../escape",
        "a//b",
        "a/",
        "./a",
        ".pico-tmp.x",
    ] {
        match wait(store.put(key, Bytes::from_static(b"x"))) {
            Err(StoreError::BadUri(message)) => {
                assert!(message.contains("invalid object key"), "{message}")
            }
            other => panic!("put {key:?} gave {other:?}"),
        }
        assert!(
            matches!(wait(store.get(key, usize::MAX)), Err(StoreError::BadUri(_))),
            "{key:?}"
        );
        assert!(
            matches!(wait(store.get_range(key, 0, 1)), Err(StoreError::BadUri(_))),
            "{key:?}"
        );
        assert!(
            matches!(wait(store.delete(key)), Err(StoreError::BadUri(_))),
            "{key:?}"
        );
    }
    assert!(matches!(
        wait(store.list("../")),
        Err(StoreError::BadUri(_))
    ));
    assert!(matches!(wait(store.list("/")), Err(StoreError::BadUri(_))));
    assert!(!dir.path().join("escape").exists());
    assert_eq!(wait(store.list("")).unwrap(), vec![]);
}

#[test]
fn concurrent_puts_from_several_threads() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(dir.path());
    let workers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let store = store.clone();
            std::thread::spawn(move || {
                // Queue everything, then await: the store runs up to max_in_flight at once.
                let replies: Vec<_> = (0..PER_THREAD)
                    .map(|i| {
                        let data = Bytes::from(format!("thread {thread} object {i}").repeat(i + 1));
                        store.put(&format!("t{thread}/o{i:03}"), data)
                    })
                    .collect();
                replies.into_iter().for_each(|reply| wait(reply).unwrap());
                // The same key from every thread: last writer wins, and the object is never torn.
                wait(store.put("shared", Bytes::from(vec![thread as u8; 4096]))).unwrap();
            })
        })
        .collect();
    workers
        .into_iter()
        .for_each(|worker| worker.join().unwrap());

    let listed = wait(store.list("")).unwrap();
    assert_eq!(listed.len(), THREADS * PER_THREAD + 1);
    for thread in 0..THREADS {
        for i in 0..PER_THREAD {
            let key = format!("t{thread}/o{i:03}");
            let expected = format!("thread {thread} object {i}").repeat(i + 1);
            assert_eq!(
                wait(store.get(&key, usize::MAX)).unwrap(),
                expected.as_bytes()
            );
        }
    }
    let shared = wait(store.get("shared", usize::MAX)).unwrap();
    assert_eq!(shared.len(), 4096);
    assert!(shared.iter().all(|byte| *byte == shared[0]));
}

/// Concurrency, not speed: four requests each stalled for one second finish in about one second
/// when they run side by side and in at least four when they run one at a time; the bound sits
/// between the two with two seconds of slack for a loaded machine.
#[test]
fn a_slow_request_does_not_block_the_others() {
    let uri = StorageUri::parse("1@mem://tests-slow").unwrap();
    let store = ObjectStore::open_with(
        &uri,
        ObjectStoreOptions {
            max_in_flight: 8,
            ..Default::default()
        },
    )
    .unwrap();
    wait(store.put("k", Bytes::from_static(b"v"))).unwrap();
    store.faults().set_delay(Duration::from_secs(1));
    let started = Instant::now();
    // Eight 1 s requests: one at a time they cannot finish in under 8 s, so the bound below
    // tests concurrency, not the machine's speed (it leaves 6.5 s for a loaded machine).
    let replies: Vec<_> = (0..8).map(|_| store.get("k", usize::MAX)).collect();
    for reply in replies {
        assert_eq!(wait(reply).unwrap(), "v");
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1),
        "the delay was not applied: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_millis(7500),
        "requests ran one at a time: {elapsed:?}"
    );
    store.faults().clear();
}

#[test]
fn injected_failures() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(dir.path());
    store.faults().fail_puts(2);
    for _ in 0..2 {
        match wait(store.put("k", Bytes::from_static(b"v"))) {
            Err(StoreError::Io(message)) => assert_eq!(message, "injected fault"),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        matches!(
            wait(store.get("k", usize::MAX)),
            Err(StoreError::NotFound(_))
        ),
        "a failed put stores nothing"
    );
    wait(store.put("k", Bytes::from_static(b"v"))).unwrap();
    store.faults().fail_gets(1);
    assert!(matches!(
        wait(store.get_range("k", 0, 1)),
        Err(StoreError::Io(_))
    ));
    assert_eq!(wait(store.get("k", usize::MAX)).unwrap(), "v");
}

#[test]
fn shutdown_finishes_queued_work_then_answers_closed() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(dir.path());
    let clone = store.clone();
    let queued: Vec<_> = (0..20)
        .map(|i| store.put(&format!("k{i}"), Bytes::from_static(b"v")))
        .collect();
    store.shutdown();
    store.shutdown(); // idempotent
    for reply in queued {
        wait(reply).unwrap();
    }
    assert!(matches!(
        wait(clone.get("k0", usize::MAX)),
        Err(StoreError::Closed)
    ));
    assert!(matches!(
        wait(clone.put("k0", Bytes::new())),
        Err(StoreError::Closed)
    ));
    assert!(matches!(wait(clone.list("")), Err(StoreError::Closed)));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 20);
}

#[test]
fn dropping_the_last_handle_finishes_queued_work() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(dir.path());
    let replies: Vec<_> = (0..10)
        .map(|i| store.put(&format!("d/{i}"), Bytes::from_static(b"v")))
        .collect();
    drop(store);
    for reply in replies {
        wait(reply).unwrap();
    }
    assert_eq!(std::fs::read_dir(dir.path().join("d")).unwrap().count(), 10);
}

#[test]
fn open_errors() {
    // An s3:// endpoint must be a URL (checked before credentials or the network).
    let s3 = StorageUri::parse("-3@s3://picomq?region=garage&endpoint=127.0.0.1:3900").unwrap();
    match ObjectStore::open(&s3) {
        Err(StoreError::BadUri(message)) => {
            assert!(
                message.contains("is not an http:// or https:// URL"),
                "{message}"
            )
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("s3 opened"),
    }
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let uri = StorageUri {
        bucket_id: 0,
        location: StorageLocation::File(blocker.join("objects")),
    };
    assert!(matches!(ObjectStore::open(&uri), Err(StoreError::Io(_))));
}

#[test]
fn uri_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(dir.path());
    assert_eq!(store.uri().bucket_id, -2);
}

/// A put given a durable local copy of its bytes (a sealed WAL file) links that file into a
/// `file://` bucket instead of writing the bytes again: the object is the file's first `len`
/// bytes, it outlives the file's own name, and a later put replaces it without touching the
/// file. A bucket in memory stores the bytes.
#[test]
fn a_put_with_a_local_copy_links_it_into_a_file_bucket() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir.path().join("bucket"));
    let wal = dir.path().join("segment.wal");
    // Like a WAL file: the segment's bytes, then zeros up to its pre-allocated size.
    let data = Bytes::from_static(b"frames of a sealed segment");
    let mut file = data.to_vec();
    file.resize(4096, 0);
    std::fs::write(&wal, &file).unwrap();

    wait(store.put_with_local_copy("segments/n1/a.seg", data.clone(), wal.clone())).unwrap();
    let object = dir.path().join("bucket/segments/n1/a.seg");
    assert_eq!(std::fs::read(&object).unwrap(), data);
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), data.len() as u64);
    assert_eq!(
        std::fs::metadata(&object).unwrap().ino(),
        std::fs::metadata(&wal).unwrap().ino(),
        "linked, not copied"
    );
    // The WAL file goes once the catalog knows the segment; the object stays.
    std::fs::remove_file(&wal).unwrap();
    assert_eq!(
        wait(store.get("segments/n1/a.seg", usize::MAX)).unwrap(),
        data
    );
    assert_eq!(
        wait(store.list("segments/n1/")).unwrap(),
        vec![("segments/n1/a.seg".to_string(), data.len() as u64)]
    );
    // A retried upload of the same key (recovery re-puts from the WAL) replaces the object.
    wait(store.put("segments/n1/a.seg", Bytes::from_static(b"again"))).unwrap();
    assert_eq!(
        wait(store.get("segments/n1/a.seg", usize::MAX)).unwrap(),
        "again"
    );

    // Nothing to link from: the bytes are written instead.
    let missing = dir.path().join("gone.wal");
    wait(store.put_with_local_copy("segments/b.seg", data.clone(), missing)).unwrap();
    assert_eq!(wait(store.get("segments/b.seg", usize::MAX)).unwrap(), data);

    let memory = ObjectStore::open(&StorageUri::parse("-2@mem://link-test").unwrap()).unwrap();
    let other = dir.path().join("other.wal");
    std::fs::write(&other, &file).unwrap();
    wait(memory.put_with_local_copy("k", data.clone(), other.clone())).unwrap();
    assert_eq!(wait(memory.get("k", usize::MAX)).unwrap(), data);
    assert_eq!(std::fs::metadata(&other).unwrap().len(), 4096, "untouched");
}
