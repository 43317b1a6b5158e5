//! Tests of the state files: saves, loads, the format-1 conversion, backups and the errors
//! naming a bad file.

use std::os::unix::fs::PermissionsExt;
use std::sync::RwLock;

use ring::rand::SystemRandom;

use super::*;
use crate::subscriptions::registry::{
    parse_config, AckRequest, Clock, FieldError, Kind, LinkKind, StreamTail,
};

const ROOT: &str = "/v1/stream/";
const BASE: &str = "http://127.0.0.1:4437/v1/stream/";

fn offset(n: u64) -> String {
    crate::ds::format_offset(n, 0)
}

fn keys() -> (SigningKey, TokenKey) {
    let rng = SystemRandom::new();
    (
        SigningKey::generate(&rng).unwrap(),
        TokenKey::generate(&rng).unwrap(),
    )
}

/// A webhook and a pull-wake subscription with explicit and pattern links, an ack, a
/// finished wake and one still outstanding.
fn populated(tokens: TokenKey) -> Registry {
    let mut reg = Registry::new(tokens);
    let clock = Clock::now();
    let hook = parse_config(&json!({"type": "webhook", "pattern": "events/*",
        "streams": ["manual/a"], "webhook": {"url": "http://127.0.0.1:9/hook"},
        "lease_ttl_ms": 5000, "description": "the webhook"}))
    .unwrap();
    // The stream ids the links count in are kept too.
    let tail = |n, id| StreamTail {
        offset: offset(n),
        stream_id: Some(id),
    };
    let links = vec![("manual/a".to_string(), LinkKind::Explicit, tail(3, 11))];
    reg.create("hook", ROOT, ROOT, BASE, hook, links, clock)
        .unwrap();
    let pull = parse_config(&json!({"type": "pull-wake", "pattern": "events/*",
        "wake_stream": "wake/pool"}))
    .unwrap();
    reg.create("pull", ROOT, ROOT, BASE, pull, vec![], clock)
        .unwrap();
    reg.on_write("/v1/stream/events/x", &tail(2, 12), clock);
    let mut effects = Vec::new();
    let claimed = reg
        .claim("/v1/stream/pull", "w1", clock, &mut effects)
        .unwrap();
    let ack = AckRequest {
        wake_id: claimed["wake_id"].as_str().map(str::to_string),
        generation: claimed["generation"].as_u64(),
        acks: vec![("events/x".into(), offset(1))],
        done: false,
    };
    let token = claimed["token"].as_str().unwrap();
    reg.settle(
        "/v1/stream/pull",
        Kind::PullWake,
        token,
        &ack,
        clock,
        &mut effects,
    )
    .unwrap();
    reg
}

#[test]
fn state_round_trips_through_the_encoding() {
    let (signing, tokens) = keys();
    let reg = populated(tokens);
    let snapshot = reg.snapshot();
    assert_eq!(snapshot.as_array().unwrap().len(), 2);
    let bytes = encode(&reg, &signing);
    let (signing2, reg2) = decode(&bytes).unwrap();
    assert_eq!(signing2.kid(), signing.kid());
    assert_eq!(signing2.jwks_json(), signing.jwks_json());
    assert_eq!(reg2.snapshot(), snapshot);
    assert_eq!(reg2.tokens().secret(), reg.tokens().secret());
    for id in ["/v1/stream/hook", "/v1/stream/pull"] {
        assert_eq!(
            reg2.describe(id, "k", "u"),
            reg.describe(id, "k", "u"),
            "{id}"
        );
        assert_eq!(reg2.config(id), reg.config(id));
    }
    let pull = snapshot
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "pull")
        .unwrap();
    assert_eq!(pull["generation"], 1);
    assert_eq!(
        pull["streams"],
        json!([{"path": "events/x", "explicit": false, "glob": true,
            "acked": offset(1), "tail": offset(2), "stream_id": 12}])
    );
    // Encoding is deterministic: the same state, the same bytes.
    assert_eq!(encode(&reg2, &signing2), bytes);
}

#[test]
fn save_replaces_the_file_atomically_and_privately() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    assert!(store.load().unwrap().is_none());
    let (signing, tokens) = keys();
    let registry = RwLock::new(Registry::new(tokens));
    // Nothing changed yet: nothing is written.
    store.save(&registry, &signing).unwrap();
    assert!(!store.path().exists());
    let config = parse_config(&json!({"type": "pull-wake", "streams": ["a"],
        "wake_stream": "w"}))
    .unwrap();
    registry
        .write()
        .unwrap()
        .create("s", ROOT, ROOT, BASE, config, vec![], Clock::now())
        .unwrap();
    assert!(store.behind(registry.read().unwrap().version()));
    // A temporary file left by a crash mid-write is replaced, never read.
    let tmp = dir.path().join(format!("{FILE_NAME}{TMP_SUFFIX}"));
    std::fs::write(&tmp, b"torn").unwrap();
    store.save(&registry, &signing).unwrap();
    assert!(!store.behind(registry.read().unwrap().version()));
    assert!(!tmp.exists());
    let mode = std::fs::metadata(store.path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (signing2, reg2) = Store::new(dir.path()).load().unwrap().unwrap();
    assert_eq!(signing2.kid(), signing.kid());
    assert_eq!(reg2.snapshot(), registry.read().unwrap().snapshot());
    // A second state replaces the first whole.
    registry.write().unwrap().delete("/v1/stream/s");
    store.save(&registry, &signing).unwrap();
    let (_, reg3) = store.load().unwrap().unwrap();
    assert_eq!(reg3.len(), 0);
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [DIR_NAME, FILE_NAME]);
    assert_eq!(
        std::fs::read_dir(dir.path().join(DIR_NAME))
            .unwrap()
            .count(),
        0,
        "a deleted subscription's file is removed"
    );
}

fn inodes(dir: &Path) -> std::collections::BTreeMap<String, u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir.join(DIR_NAME))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                e.metadata().unwrap().ino(),
            )
        })
        .collect()
}

/// A change rewrites the file of its subscription and no other (the whole state was
/// rewritten on every change: 131 MB per ack with 60 subscriptions of 1,000 long paths).
#[test]
fn a_change_rewrites_only_its_subscriptions_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let (signing, tokens) = keys();
    let registry = RwLock::new(populated(tokens));
    store.save(&registry, &signing).unwrap();
    let before = inodes(dir.path());
    assert_eq!(before.len(), 2);
    registry
        .write()
        .unwrap()
        .remove_explicit("/v1/stream/hook", "manual/a")
        .unwrap();
    store.save(&registry, &signing).unwrap();
    let after = inodes(dir.path());
    let hook = file_name("/v1/stream/hook");
    for (name, inode) in &before {
        if *name == hook {
            assert_ne!(after[name], *inode, "the changed subscription is rewritten");
        } else {
            assert_eq!(after[name], *inode, "{name} is left alone");
        }
    }
    let (_, loaded) = store.load().unwrap().unwrap();
    assert_eq!(loaded.snapshot(), registry.read().unwrap().snapshot());
}

/// A state file of format 1 (earlier releases) is read whole, and the first save writes
/// it as format 2; a conversion a crash interrupted is simply done again.
#[test]
fn a_format_1_file_is_read_and_written_again_as_format_2() {
    let dir = tempfile::tempdir().unwrap();
    let (signing, tokens) = keys();
    let old = populated(tokens);
    std::fs::write(dir.path().join(FILE_NAME), encode(&old, &signing)).unwrap();
    // Left by a conversion that did not finish: replaced.
    std::fs::create_dir(dir.path().join(DIR_NAME)).unwrap();
    std::fs::write(dir.path().join(DIR_NAME).join("stale.json"), b"{}").unwrap();
    let store = Store::new(dir.path());
    let (signing2, registry) = store.load().unwrap().unwrap();
    assert_eq!(registry.snapshot(), old.snapshot());
    let registry = RwLock::new(registry);
    store.save(&registry, &signing2).unwrap();
    let main: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(FILE_NAME)).unwrap()).unwrap();
    assert_eq!(main["format"], FORMAT_VERSION);
    assert!(main.get("subscriptions").is_none());
    assert_eq!(inodes(dir.path()).len(), 2);
    let (signing3, reloaded) = Store::new(dir.path()).load().unwrap().unwrap();
    assert_eq!(signing3.kid(), signing.kid());
    assert_eq!(reloaded.snapshot(), old.snapshot());
    assert_eq!(reloaded.tokens().secret(), old.tokens().secret());
}

#[test]
fn links_of_a_file_that_kept_no_stream_ids_are_read() {
    let (_, tokens) = keys();
    let (_, tokens_again) = keys();
    let reg = populated(tokens);
    let mut snapshot = reg.snapshot();
    for sub in snapshot.as_array_mut().unwrap() {
        for stream in sub["streams"].as_array_mut().unwrap() {
            stream.as_object_mut().unwrap().remove("stream_id");
        }
    }
    let restored = Registry::restore(&snapshot, tokens_again).unwrap();
    assert_eq!(restored.snapshot(), snapshot);
}

#[test]
fn a_bad_subscription_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let (signing, tokens) = keys();
    let registry = RwLock::new(populated(tokens));
    store.save(&registry, &signing).unwrap();
    let bad = dir.path().join(DIR_NAME).join(file_name("/v1/stream/hook"));
    std::fs::write(&bad, b"{\"id\": 1}").unwrap();
    let err = Store::new(dir.path()).load().err().unwrap();
    assert!(
        matches!(&err, StoreError::Subscription(SnapshotError::Subscription { label, .. })
            if *label == bad.display().to_string()),
        "{err}"
    );
    assert!(
        err.to_string().starts_with(&bad.display().to_string()),
        "{err}"
    );
    std::fs::write(&bad, b"{not json").unwrap();
    let err = Store::new(dir.path()).load().err().unwrap();
    assert!(
        matches!(&err, StoreError::Contents { path, error: StateError::Json(_) } if *path == bad),
        "{err}"
    );
    assert!(err.to_string().contains("not valid JSON"), "{err}");
}

#[test]
fn a_bad_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let (signing, tokens) = keys();
    let good: Value = serde_json::from_slice(&encode(&populated(tokens), &signing)).unwrap();
    let mut wrong_kid = good.clone();
    wrong_kid["signing_key"]["kid"] = json!("ds_other");
    let mut future = good.clone();
    future["format"] = json!(FORMAT_VERSION + 1);
    let mut short_key = good.clone();
    short_key["token_key"] = json!(STANDARD.encode([0u8; 16]));
    let mut bad_ack = good.clone();
    bad_ack["subscriptions"][0]["streams"][0]
        .as_object_mut()
        .unwrap()
        .remove("acked");
    let mut bad_config = good.clone();
    bad_config["subscriptions"][1]["config"]["type"] = json!("carrier-pigeon");
    let mut duplicate = good.clone();
    let first = duplicate["subscriptions"][0].clone();
    duplicate["subscriptions"][1] = first;
    let text = good.to_string();
    type Check = fn(&StateError) -> bool;
    let cases: Vec<(&str, Vec<u8>, &str, Check)> = vec![
        (
            "truncated",
            text.as_bytes()[..text.len() / 2].to_vec(),
            "not valid JSON",
            |e| matches!(e, StateError::Json(_)),
        ),
        ("empty", Vec::new(), "not valid JSON", |e| {
            matches!(e, StateError::Json(_))
        }),
        (
            "wrong kid",
            wrong_kid.to_string().into_bytes(),
            "kid",
            |e| matches!(e, StateError::KidMismatch(_)),
        ),
        (
            "future format",
            future.to_string().into_bytes(),
            "format",
            |e| matches!(e, StateError::UnknownFormat(f) if *f == FORMAT_VERSION + 1),
        ),
        (
            "short token key",
            short_key.to_string().into_bytes(),
            "token_key",
            |e| matches!(e, StateError::TokenKey),
        ),
        (
            "missing ack",
            bad_ack.to_string().into_bytes(),
            "acked",
            |e| {
                matches!(
                    e,
                    StateError::Subscriptions(SnapshotError::Subscription {
                        error: FieldError::NotAString("acked"),
                        ..
                    })
                )
            },
        ),
        (
            "bad config",
            bad_config.to_string().into_bytes(),
            "config",
            |e| {
                matches!(
                    e,
                    StateError::Subscriptions(SnapshotError::Subscription {
                        error: FieldError::Config(_),
                        ..
                    })
                )
            },
        ),
        (
            "duplicate",
            duplicate.to_string().into_bytes(),
            "duplicate",
            |e| {
                matches!(
                    e,
                    StateError::Subscriptions(SnapshotError::DuplicateId { .. })
                )
            },
        ),
    ];
    for (what, bytes, needle, check) in cases {
        std::fs::write(store.path(), bytes).unwrap();
        let err = store
            .load()
            .err()
            .unwrap_or_else(|| panic!("{what} loaded"));
        assert!(
            matches!(&err, StoreError::Contents { path, error } if path == store.path() && check(error)),
            "{what}: {err:?}"
        );
        // The operator reads the file's name first, then what is wrong in it.
        let message = err.to_string();
        assert!(
            message.starts_with(&store.path().display().to_string()) && message.contains(needle),
            "{what}: {message}"
        );
    }
    let err = crate::subscriptions::Subscriptions::open(dir.path())
        .err()
        .unwrap();
    assert!(err.to_string().contains(FILE_NAME), "{err}");
    std::fs::write(store.path(), text).unwrap();
    assert_eq!(store.load().unwrap().unwrap().1.len(), 2);
    let opened = crate::subscriptions::Subscriptions::open(dir.path()).unwrap();
    assert_eq!(opened.len(), 2);
    // Unreadable (a directory where the file should be) is an error too, not a fresh start.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir(other.path().join(FILE_NAME)).unwrap();
    let err = Store::new(other.path()).load().err().unwrap();
    assert!(
        matches!(&err, StoreError::Io { action: Action::Read, path, .. } if path.ends_with(FILE_NAME)),
        "{err}"
    );
}
