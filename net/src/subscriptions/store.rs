//! The node's subscription state: the node's keys in `<dir>/subscriptions.json`, and each
//! subscription in a file of its own under `<dir>/subscriptions.d/`, so a change to one
//! subscription (an ack, a created or deleted one) rewrites that one file, never the others.
//!
//! ```text
//! subscriptions.json          {"format": 2,
//!                              "signing_key": {"kid": "ds_…", "pkcs8": "<base64>"},
//!                              "token_key": "<base64>"}
//! subscriptions.d/<h>.json    {"id": "…", "root": "…", "config": {…},
//!                              "streams": [{"path": "…", "acked": "…", …}], …}
//!                             <h>: the first 32 hex digits of SHA-256(root + id)
//! ```
//!
//! Every file is replaced atomically: written to `<name>.tmp` (mode 0600: the main file holds
//! keys, and no file is for others), fsynced, renamed over the file; the directory is fsynced
//! after each save. A missing main file is a fresh start; a file that cannot be read or parsed
//! stops the node (it would otherwise start without subscriptions it had), naming the file.
//!
//! Format 1 (earlier releases) kept every subscription in the main file, rewritten whole on
//! each change. It is read, and the first save writes the state in format 2: the
//! subscriptions' files first, the main file last, so a crash in between leaves format 1 to be
//! read again.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

use super::keys::{InvalidKey, SigningKey, TokenKey, TOKEN_KEY_LEN};
use super::registry::{Registry, SnapshotError};

pub const FILE_NAME: &str = "subscriptions.json";
/// The directory of the subscriptions' own files.
pub const DIR_NAME: &str = "subscriptions.d";
const TMP_SUFFIX: &str = ".tmp";
/// The `format` this node writes.
pub const FORMAT_VERSION: u64 = 2;
/// The format of earlier releases (every subscription in the main file), read and converted.
const FORMAT_WHOLE: u64 = 1;

/// Why the state files cannot be read or written.
#[derive(Debug)]
pub enum StoreError {
    /// `action` on `path` failed.
    Io {
        action: Action,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file `path` holds no state this node reads.
    Contents { path: PathBuf, error: StateError },
    /// A subscription's file holds no subscription (the error names the file).
    Subscription(SnapshotError),
}

/// What was done to a file when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Create,
    Read,
    Remove,
    Write,
    Copy,
}

impl StoreError {
    fn io(action: Action, path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Io {
                action,
                path,
                source,
            } => {
                let action = match action {
                    Action::Create => "create",
                    Action::Read => "read",
                    Action::Remove => "remove",
                    Action::Write => "write",
                    Action::Copy => "copy",
                };
                write!(f, "cannot {action} {}: {source}", path.display())
            }
            StoreError::Contents { path, error } => write!(f, "{}: {error}", path.display()),
            StoreError::Subscription(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Io { source, .. } => Some(source),
            StoreError::Contents { error, .. } => Some(error),
            StoreError::Subscription(error) => Some(error),
        }
    }
}

/// What is wrong in the contents of a main file (or a format-1 document).
#[derive(Debug)]
pub enum StateError {
    Json(serde_json::Error),
    /// A `format` this node does not read.
    UnknownFormat(u64),
    /// Not format 1, where a whole state (keys and subscriptions) is expected.
    NotWhole(u64),
    NoFormat,
    Pkcs8NotBase64,
    SigningKey(InvalidKey),
    /// `signing_key.kid` names another key than `pkcs8` (the kid of that key).
    KidMismatch(String),
    /// `token_key` is not [`TOKEN_KEY_LEN`] bytes of base64.
    TokenKey,
    Subscriptions(SnapshotError),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Json(e) => write!(f, "not valid JSON ({e})"),
            StateError::UnknownFormat(format) => write!(
                f,
                "format {format} is not a format this version reads ({FORMAT_WHOLE} or \
                 {FORMAT_VERSION})"
            ),
            StateError::NotWhole(format) => write!(
                f,
                "format {format} is not the format {FORMAT_WHOLE} of a whole state"
            ),
            StateError::NoFormat => f.write_str("no format version"),
            StateError::Pkcs8NotBase64 => f.write_str("signing_key.pkcs8 is not base64"),
            StateError::SigningKey(e) => write!(f, "signing_key: {e}"),
            StateError::KidMismatch(kid) => {
                write!(f, "signing_key.kid does not name its key (expected {kid})")
            }
            StateError::TokenKey => write!(f, "token_key is not {TOKEN_KEY_LEN} bytes of base64"),
            StateError::Subscriptions(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StateError::Json(e) => Some(e),
            StateError::SigningKey(e) => Some(e),
            StateError::Subscriptions(e) => Some(e),
            _ => None,
        }
    }
}

pub struct Store {
    dir: PathBuf,
    path: PathBuf,
    subs_dir: PathBuf,
    /// Held while changes are taken and written, so files are written in change order.
    writing: Mutex<()>,
    /// The registry version on disk (changed only under `writing`).
    written: AtomicU64,
    /// Whether the main file is in format 2 (else the next save writes every subscription and
    /// then the main file).
    layout_written: AtomicBool,
}

impl Store {
    pub fn new(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
            path: dir.join(FILE_NAME),
            subs_dir: dir.join(DIR_NAME),
            writing: Mutex::new(()),
            written: AtomicU64::new(0),
            layout_written: AtomicBool::new(false),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the registry at `version` is newer than the files.
    pub fn behind(&self, version: u64) -> bool {
        self.written.load(Ordering::Acquire) != version
    }

    /// The keys and subscriptions on disk; `None` if there is no main file yet.
    pub fn load(&self) -> Result<Option<(SigningKey, Registry)>, StoreError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(Action::Read, &self.path)(e)),
        };
        let named = |error: StateError| StoreError::Contents {
            path: self.path.clone(),
            error,
        };
        let state: Value =
            serde_json::from_slice(&bytes).map_err(|e| named(StateError::Json(e)))?;
        match state["format"].as_u64() {
            Some(FORMAT_VERSION) => {
                let (signing, tokens) = decode_keys(&state).map_err(named)?;
                let registry = Registry::restore_labeled(&self.read_subscriptions()?, tokens)
                    .map_err(StoreError::Subscription)?;
                self.layout_written.store(true, Ordering::Release);
                Ok(Some((signing, registry)))
            }
            Some(FORMAT_WHOLE) => {
                let (signing, mut registry) = decode(&bytes).map_err(named)?;
                // Written again in format 2 by the first save.
                registry.mark_all_changed();
                Ok(Some((signing, registry)))
            }
            Some(other) => Err(named(StateError::UnknownFormat(other))),
            None => Err(named(StateError::NoFormat)),
        }
    }

    /// Every subscription file, labelled by its path for errors; leftovers of a crash
    /// mid-write (`*.tmp`, never renamed, so never the state of an answer) are removed.
    fn read_subscriptions(&self) -> Result<Vec<(String, Value)>, StoreError> {
        let entries = match std::fs::read_dir(&self.subs_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::io(Action::Read, &self.subs_dir)(e)),
        };
        let mut items = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(StoreError::io(Action::Read, &self.subs_dir))?
                .path();
            let label = path.display().to_string();
            if label.ends_with(TMP_SUFFIX) {
                std::fs::remove_file(&path).map_err(StoreError::io(Action::Remove, &path))?;
                continue;
            }
            let bytes = std::fs::read(&path).map_err(StoreError::io(Action::Read, &path))?;
            let item = match serde_json::from_slice(&bytes) {
                Ok(item) => item,
                Err(e) => {
                    return Err(StoreError::Contents {
                        path,
                        error: StateError::Json(e),
                    })
                }
            };
            items.push((label, item));
        }
        items.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(items)
    }

    /// Writes what changed in the registry since the last save: the changed subscriptions'
    /// files (a deleted one's is removed). Blocks (file I/O and fsyncs): call it off the cores.
    pub fn save(
        &self,
        registry: &std::sync::RwLock<Registry>,
        signing: &SigningKey,
    ) -> Result<(), StoreError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (version, changed, files, tokens_secret) = {
            let mut registry = registry.write().unwrap_or_else(|e| e.into_inner());
            if !self.behind(registry.version()) {
                return Ok(());
            }
            let changed = registry.take_changed();
            let files: Vec<(String, Option<Vec<u8>>)> = changed
                .iter()
                .map(|key| (file_name(key), registry.snapshot_of(key).map(to_bytes)))
                .collect();
            (
                registry.version(),
                changed,
                files,
                *registry.tokens().secret(),
            )
        };
        let written = if self.layout_written.load(Ordering::Acquire) {
            self.write_subscriptions(&files)
        } else {
            self.write_layout(&files, signing, &tokens_secret)
        };
        if let Err(e) = written {
            let mut registry = registry.write().unwrap_or_else(|e| e.into_inner());
            registry.keep_changed(changed);
            return Err(e);
        }
        self.written.store(version, Ordering::Release);
        Ok(())
    }

    /// Copies the state files as they are now into `dest` (a backup: `dest/subscriptions.json`
    /// and `dest/subscriptions.d/`), none changing meanwhile: a save waits for the copy. The
    /// number of subscription files copied. Blocks: call it off the cores.
    pub fn copy_to(&self, dest: &Path) -> Result<usize, StoreError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let failed = |path: &Path, e: std::io::Error| StoreError::io(Action::Copy, path)(e);
        match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(failed(&self.path, e)),
            Ok(_) => {}
        }
        let dest_subs = dest.join(DIR_NAME);
        std::fs::create_dir_all(&dest_subs).map_err(|e| failed(&dest_subs, e))?;
        copy_durably(&self.path, &dest.join(FILE_NAME)).map_err(|e| failed(&self.path, e))?;
        let mut copied = 0;
        let entries = match std::fs::read_dir(&self.subs_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(failed(&self.subs_dir, e)),
        };
        for entry in entries {
            let path = entry.map_err(|e| failed(&self.subs_dir, e))?.path();
            if path.to_string_lossy().ends_with(TMP_SUFFIX) {
                continue;
            }
            let name = path.file_name().unwrap_or_default();
            copy_durably(&path, &dest_subs.join(name)).map_err(|e| failed(&path, e))?;
            copied += 1;
        }
        for dir in [&dest_subs, &dest.to_path_buf()] {
            File::open(dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| failed(dir, e))?;
        }
        Ok(copied)
    }

    /// Replaces or removes each subscription file, then makes the directory durable.
    fn write_subscriptions(&self, files: &[(String, Option<Vec<u8>>)]) -> Result<(), StoreError> {
        let failed = |e| StoreError::io(Action::Write, &self.subs_dir)(e);
        for (name, bytes) in files {
            let path = self.subs_dir.join(name);
            match bytes {
                Some(bytes) => replace(&self.subs_dir, &path, bytes).map_err(failed)?,
                None => match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != ErrorKind::NotFound => return Err(failed(e)),
                    _ => {}
                },
            }
        }
        File::open(&self.subs_dir)
            .and_then(|dir| dir.sync_all())
            .map_err(failed)
    }

    /// The first save of this layout (a fresh start, or the state of format 1): the
    /// directory emptied of anything an interrupted conversion left, every subscription
    /// written, then the main file.
    fn write_layout(
        &self,
        files: &[(String, Option<Vec<u8>>)],
        signing: &SigningKey,
        token_secret: &[u8; TOKEN_KEY_LEN],
    ) -> Result<(), StoreError> {
        let failed = |e| StoreError::io(Action::Write, &self.subs_dir)(e);
        match std::fs::create_dir(&self.subs_dir) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => return Err(failed(e)),
            _ => {}
        }
        let wanted: HashSet<&str> = files
            .iter()
            .filter(|(_, bytes)| bytes.is_some())
            .map(|(name, _)| name.as_str())
            .collect();
        for entry in std::fs::read_dir(&self.subs_dir).map_err(failed)? {
            let entry = entry.map_err(failed)?;
            if !wanted.contains(entry.file_name().to_string_lossy().as_ref()) {
                std::fs::remove_file(entry.path()).map_err(failed)?;
            }
        }
        self.write_subscriptions(files)?;
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(failed)?;
        let main = to_bytes(json!({
            "format": FORMAT_VERSION,
            "signing_key": {"kid": signing.kid(), "pkcs8": STANDARD.encode(signing.pkcs8())},
            "token_key": STANDARD.encode(token_secret),
        }));
        replace(&self.dir, &self.path, &main)
            .and_then(|()| File::open(&self.dir)?.sync_all())
            .map_err(StoreError::io(Action::Write, &self.path))?;
        self.layout_written.store(true, Ordering::Release);
        Ok(())
    }
}

/// The file of the subscription with registry key `key`: a hash, since keys hold `/` and may
/// be longer than a file name.
fn file_name(key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{hex}.json")
}

fn to_bytes(value: Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Copies `from` to the new file `to` (mode 0600, as every state file), fsynced.
fn copy_durably(from: &Path, to: &Path) -> std::io::Result<()> {
    let bytes = std::fs::read(from)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    file.write_all(&bytes)?;
    file.sync_all()
}

/// Replaces `path` (in `dir`) with `bytes`: a temporary file, fsync, rename.
fn replace(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
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
    std::fs::rename(&tmp, path)
}

/// The whole state in format 1 (every subscription in one document), as earlier releases
/// wrote it: what the conversion reads, written by tests.
#[cfg(test)]
pub fn encode(registry: &Registry, signing: &SigningKey) -> Vec<u8> {
    to_bytes(json!({
        "format": FORMAT_WHOLE,
        "signing_key": {"kid": signing.kid(), "pkcs8": STANDARD.encode(signing.pkcs8())},
        "token_key": STANDARD.encode(registry.tokens().secret()),
        "subscriptions": registry.snapshot(),
    }))
}

/// The keys of a main file (either format).
fn decode_keys(state: &Value) -> Result<(SigningKey, TokenKey), StateError> {
    let key = &state["signing_key"];
    let pkcs8 = key["pkcs8"]
        .as_str()
        .and_then(|b| STANDARD.decode(b).ok())
        .ok_or(StateError::Pkcs8NotBase64)?;
    let signing = SigningKey::from_pkcs8(&pkcs8).map_err(StateError::SigningKey)?;
    if key["kid"].as_str() != Some(signing.kid()) {
        return Err(StateError::KidMismatch(signing.kid().to_string()));
    }
    let secret: [u8; TOKEN_KEY_LEN] = state["token_key"]
        .as_str()
        .and_then(|b| STANDARD.decode(b).ok())
        .and_then(|b| b.try_into().ok())
        .ok_or(StateError::TokenKey)?;
    Ok((signing, TokenKey::from_secret(secret)))
}

/// A format-1 document: the keys and every subscription.
pub fn decode(bytes: &[u8]) -> Result<(SigningKey, Registry), StateError> {
    let state: Value = serde_json::from_slice(bytes).map_err(StateError::Json)?;
    match state["format"].as_u64() {
        Some(FORMAT_WHOLE) => {}
        Some(other) => return Err(StateError::NotWhole(other)),
        None => return Err(StateError::NoFormat),
    }
    let (signing, tokens) = decode_keys(&state)?;
    let registry =
        Registry::restore(&state["subscriptions"], tokens).map_err(StateError::Subscriptions)?;
    Ok((signing, registry))
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
