//! The node's subscription state file, `<dir>/subscriptions.json`: the subscriptions (see
//! `Registry::snapshot` for what of them is kept) and the node's keys (the Ed25519 PKCS#8
//! document with its `kid`, the callback-token HMAC key), under a format version:
//!
//! ```json
//! {"format": 1,
//!  "signing_key": {"kid": "ds_…", "pkcs8": "<base64>"},
//!  "token_key": "<base64>",
//!  "subscriptions": [{"id": "…", "config": {…}, "streams": [{"path": "…", "acked": "…", …}], …}]}
//! ```
//!
//! It is replaced atomically: written to `subscriptions.json.tmp` (mode 0600: it holds keys),
//! fsynced, renamed over the file, then the directory is fsynced. A missing file is a fresh
//! start; one that cannot be read or parsed stops the node (it would otherwise start empty and
//! lose every subscription).

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

use super::keys::{SigningKey, TokenKey, TOKEN_KEY_LEN};
use super::registry::Registry;

pub const FILE_NAME: &str = "subscriptions.json";
const TMP_NAME: &str = "subscriptions.json.tmp";
/// The `format` this node writes and reads.
pub const FORMAT_VERSION: u64 = 1;

pub struct Store {
    dir: PathBuf,
    path: PathBuf,
    /// Held while a state is snapshotted and written, so files are written in snapshot order.
    writing: Mutex<()>,
    /// The registry version in the file (changed only under `writing`).
    written: AtomicU64,
}

impl Store {
    pub fn new(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
            path: dir.join(FILE_NAME),
            writing: Mutex::new(()),
            written: AtomicU64::new(0),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the registry at `version` is newer than the file.
    pub fn behind(&self, version: u64) -> bool {
        self.written.load(Ordering::Acquire) != version
    }

    /// The keys and subscriptions in the file; `None` if there is no file yet.
    pub fn load(&self) -> Result<Option<(SigningKey, Registry)>, String> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", self.path.display())),
        };
        decode(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// Writes the registry's current state unless the file already holds its version. Blocks
    /// (file I/O and fsyncs): call it off the cores.
    pub fn save(
        &self,
        registry: &std::sync::RwLock<Registry>,
        signing: &SigningKey,
    ) -> Result<(), String> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (version, bytes) = {
            let registry = registry.read().unwrap_or_else(|e| e.into_inner());
            if !self.behind(registry.version()) {
                return Ok(());
            }
            (registry.version(), encode(&registry, signing))
        };
        self.write(&bytes)
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))?;
        self.written.store(version, Ordering::Release);
        Ok(())
    }

    /// Replaces the file with `bytes`: temporary file, fsync, rename, fsync of the directory.
    fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(TMP_NAME);
        // A leftover of a crash mid-write: never renamed, so never the state of an answer.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, &self.path)?;
        File::open(&self.dir)?.sync_all()
    }
}

pub fn encode(registry: &Registry, signing: &SigningKey) -> Vec<u8> {
    let state = json!({
        "format": FORMAT_VERSION,
        "signing_key": {"kid": signing.kid(), "pkcs8": STANDARD.encode(signing.pkcs8())},
        "token_key": STANDARD.encode(registry.tokens().secret()),
        "subscriptions": registry.snapshot(),
    });
    let mut bytes = serde_json::to_vec_pretty(&state).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

pub fn decode(bytes: &[u8]) -> Result<(SigningKey, Registry), String> {
    let state: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON ({e})"))?;
    match state["format"].as_u64() {
        Some(FORMAT_VERSION) => {}
        Some(other) => {
            return Err(format!(
                "format {other} is not the format {FORMAT_VERSION} this version reads"
            ))
        }
        None => return Err("no format version".into()),
    }
    let key = &state["signing_key"];
    let pkcs8 = key["pkcs8"]
        .as_str()
        .and_then(|b| STANDARD.decode(b).ok())
        .ok_or("signing_key.pkcs8 is not base64")?;
    let signing = SigningKey::from_pkcs8(&pkcs8).map_err(|e| format!("signing_key: {e}"))?;
    if key["kid"].as_str() != Some(signing.kid()) {
        return Err(format!(
            "signing_key.kid does not name its key (expected {})",
            signing.kid()
        ));
    }
    let secret: [u8; TOKEN_KEY_LEN] = state["token_key"]
        .as_str()
        .and_then(|b| STANDARD.decode(b).ok())
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("token_key is not {TOKEN_KEY_LEN} bytes of base64"))?;
    let registry = Registry::restore(&state["subscriptions"], TokenKey::from_secret(secret))?;
    Ok((signing, registry))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::RwLock;

    use ring::rand::SystemRandom;

    use super::*;
    use crate::ds::subscriptions::registry::{parse_config, AckRequest, Clock, Kind, LinkKind};

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
        let links = vec![("manual/a".to_string(), LinkKind::Explicit, offset(3))];
        reg.create("hook", ROOT, ROOT, BASE, hook, links, clock)
            .unwrap();
        let pull = parse_config(&json!({"type": "pull-wake", "pattern": "events/*",
            "wake_stream": "wake/pool"}))
        .unwrap();
        reg.create("pull", ROOT, ROOT, BASE, pull, vec![], clock)
            .unwrap();
        reg.on_write("/v1/stream/events/x", &offset(2), clock);
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
                "acked": offset(1), "tail": offset(2)}])
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
        std::fs::write(dir.path().join(TMP_NAME), b"torn").unwrap();
        store.save(&registry, &signing).unwrap();
        assert!(!store.behind(registry.read().unwrap().version()));
        assert!(!dir.path().join(TMP_NAME).exists());
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
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [FILE_NAME]);
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
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "truncated",
                text.as_bytes()[..text.len() / 2].to_vec(),
                "not valid JSON",
            ),
            ("empty", Vec::new(), "not valid JSON"),
            ("wrong kid", wrong_kid.to_string().into_bytes(), "kid"),
            ("future format", future.to_string().into_bytes(), "format"),
            (
                "short token key",
                short_key.to_string().into_bytes(),
                "token_key",
            ),
            ("missing ack", bad_ack.to_string().into_bytes(), "acked"),
            ("bad config", bad_config.to_string().into_bytes(), "config"),
            ("duplicate", duplicate.to_string().into_bytes(), "duplicate"),
        ];
        for (what, bytes, needle) in cases {
            std::fs::write(store.path(), bytes).unwrap();
            let err = store
                .load()
                .err()
                .unwrap_or_else(|| panic!("{what} loaded"));
            assert!(
                err.starts_with(&store.path().display().to_string()) && err.contains(needle),
                "{what}: {err}"
            );
        }
        let err = crate::ds::subscriptions::Subscriptions::open(dir.path())
            .err()
            .unwrap();
        assert!(err.contains(FILE_NAME), "{err}");
        std::fs::write(store.path(), text).unwrap();
        assert_eq!(store.load().unwrap().unwrap().1.len(), 2);
        let opened = crate::ds::subscriptions::Subscriptions::open(dir.path()).unwrap();
        assert_eq!(opened.len(), 2);
        // Unreadable (a directory where the file should be) is an error too, not a fresh start.
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir(other.path().join(FILE_NAME)).unwrap();
        let err = Store::new(other.path()).load().err().unwrap();
        assert!(err.contains(FILE_NAME), "{err}");
    }
}
