//! `POST /admin/backup` (docs/backup.md): a consistent backup of this node while it serves.
//!
//! Body `{"to": "name", "timeoutSec": 3600, "maxBytesPerSecond": n}`: `to` is a new (or empty)
//! directory under `--backup-dir`, named relative to it (or absolute, inside it); a backup
//! never writes anywhere else, whatever an admin token asks. In order: the cut
//! (the request's arrival), the garbage collector held, the subscription state copied, every
//! core's checkpoint (what only the WAL held is stored and committed), the catalog copied,
//! every object it names copied, the manifest written last. One backup at a time (`409`).
//!
//! The request is answered `202` once the backup started; `GET /admin/backup` tells how the
//! latest one stands (`running`, `complete` with its summary, `failed` with the error). The
//! work runs in a task of its own, so no client holds the collector's hold: it lasts until
//! the copy ends or its time runs out.

use std::path::{Component, Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use pico_meta::MetaUrl;
use serde_json::{json, Value};

use crate::admin::shared::{error, job_bounds, json_response, AdminState, BackupStatus};
use crate::backup::{copy_subscriptions, prepare_empty_dir, write_backup, BackupError, BackupJob};
use crate::limits::{
    BACKUP_DESTINATION_BYTES_MAX, BACKUP_TIMEOUT_SEC_DEFAULT, BACKUP_TIMEOUT_SEC_MAX,
};
use crate::transport::message::{Request, Response};

impl BackupStatus {
    fn running(&self) -> bool {
        self.0
            .borrow()
            .as_ref()
            .is_some_and(|status| status["state"] == "running")
    }

    fn set(&self, status: Value) {
        *self.0.borrow_mut() = Some(status);
    }

    fn json(&self) -> Value {
        self.0
            .borrow()
            .clone()
            .unwrap_or_else(|| json!({ "state": "none" }))
    }
}

/// Marks the backup failed if its task ends without saying how it ended.
struct Running(Rc<BackupStatus>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running() {
            let mut status = self.0.json();
            status["state"] = json!("failed");
            status["error"] = json!("the backup's task ended before the backup did");
            self.0.set(status);
        }
    }
}

/// `GET /admin/backup`.
pub(super) fn status(state: &AdminState) -> Response {
    json_response(200, state.backup.json())
}

/// What a request asks for, checked.
struct Asked {
    to: PathBuf,
    timeout: Duration,
    max_bytes_per_second: Option<u64>,
}

pub(super) async fn backup(state: &Rc<AdminState>, request: &Request) -> Response {
    let started_at_ms = pico_engine::now_ms();
    let backup_root = match std::path::absolute(&state.facts.backup_dir) {
        Ok(root) => root,
        Err(e) => return error(500, format!("--backup-dir: {e}")),
    };
    let asked = match parse(request, &backup_root) {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let db =
        match MetaUrl::parse(&state.facts.meta_url) {
            Ok(MetaUrl::SqliteFile(db)) => db,
            Ok(MetaUrl::SqliteMemory) => return error(
                400,
                "the catalog is in memory (sqlite::memory:): nothing a restart keeps to back up",
            ),
            Ok(MetaUrl::Postgres(_)) => return error(
                501,
                "a Postgres catalog (a cluster) is backed up with pg_dump: see docs/backup.md, \
                 \"Clusters\"",
            ),
            Err(e) => return error(500, e.to_string()),
        };
    if state.backup.running() {
        return error(409, "a backup of this node is running; one at a time");
    }
    // The backup directory and the parents of `to` inside it are made as needed.
    if let Some(parent) = asked.to.parent() {
        if let Err(e) = std::fs::create_dir_all(parent) {
            return error(400, format!("cannot create {}: {e}", parent.display()));
        }
    }
    if let Err(e) = prepare_empty_dir(&asked.to) {
        return error(400, e.to_string());
    }
    let to = asked.to.display().to_string();
    let running = json!({ "state": "running", "to": to, "startedAtMs": started_at_ms });
    state.backup.set(running.clone());
    let guard = Running(state.backup.clone());
    let task_state = state.clone();
    glommio::spawn_local(async move {
        let guard = guard;
        let ended = match run(&task_state, asked, db, started_at_ms).await {
            Ok(mut summary) => {
                summary["state"] = json!("complete");
                summary
            }
            Err(e) => {
                log::warn!("backup to {to} failed: {e}");
                json!({
                    "state": "failed",
                    "to": to,
                    "startedAtMs": started_at_ms,
                    "error": e.to_string(),
                })
            }
        };
        guard.0.set(ended);
    })
    .detach();
    json_response(202, running)
}

/// Why a request's `"to"` names no place for a backup (`400`).
#[derive(Debug)]
enum DestinationError {
    /// Empty, or longer than [`BACKUP_DESTINATION_BYTES_MAX`].
    Length,
    /// An absolute path outside `--backup-dir`.
    Outside { root: PathBuf, to: String },
    /// A path with `..`, `.` or no name at all.
    NotPlain { to: String },
}

impl std::fmt::Display for DestinationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DestinationError::Length => write!(
                f,
                "\"to\" must name a directory in 1 to {BACKUP_DESTINATION_BYTES_MAX} bytes"
            ),
            DestinationError::Outside { root, to } => write!(
                f,
                "\"to\" must be inside the node's --backup-dir {}, not {to}",
                root.display()
            ),
            DestinationError::NotPlain { to } => write!(
                f,
                "\"to\" must name a new directory under the node's --backup-dir with plain \
                 names (no \"..\" or \".\"), not {to:?}"
            ),
        }
    }
}

/// The directory `to` names under `root` (`--backup-dir`, absolute): a relative path of plain
/// names, or an absolute one inside `root`; never `..`, never outside.
fn resolve_destination(root: &Path, to: &str) -> Result<PathBuf, DestinationError> {
    if to.is_empty() || to.len() > BACKUP_DESTINATION_BYTES_MAX {
        return Err(DestinationError::Length);
    }
    let path = Path::new(to);
    let relative = if path.is_absolute() {
        path.strip_prefix(root)
            .map_err(|_| DestinationError::Outside {
                root: root.to_path_buf(),
                to: to.to_string(),
            })?
    } else {
        path
    };
    let plain = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    if !plain || relative.as_os_str().is_empty() {
        return Err(DestinationError::NotPlain { to: to.to_string() });
    }
    Ok(root.join(relative))
}

fn parse(request: &Request, backup_root: &Path) -> Result<Asked, Response> {
    let body: Value = serde_json::from_slice(&request.body)
        .map_err(|e| error(400, format!("invalid JSON body: {e}")))?;
    let Some(to) = body.get("to").and_then(Value::as_str) else {
        return Err(error(
            400,
            "missing \"to\" (a new directory under the node's --backup-dir)",
        ));
    };
    let to = resolve_destination(backup_root, to).map_err(|e| error(400, e.to_string()))?;
    let (timeout, max_bytes_per_second) =
        job_bounds(&body, BACKUP_TIMEOUT_SEC_DEFAULT, BACKUP_TIMEOUT_SEC_MAX)?;
    Ok(Asked {
        to,
        timeout,
        max_bytes_per_second,
    })
}

/// Why a backup failed, as `GET /admin/backup` and the log tell it.
#[derive(Debug)]
enum RunError {
    /// The garbage collector could not be held.
    Hold(pico_engine::HoldError),
    /// The subscription state could not be copied.
    Subscriptions(BackupError),
    /// A core did not store and commit what it held in time.
    Checkpoint(pico_engine::CheckpointError),
    /// The catalog, objects or manifest could not be written.
    Backup(BackupError),
    /// The backup's thread could not start.
    Thread(std::io::Error),
    /// The backup's thread ended without an answer (it panicked).
    NoAnswer,
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Hold(e) => e.fmt(f),
            RunError::Subscriptions(e) => write!(f, "subscription state: {e}"),
            RunError::Checkpoint(e) => write!(f, "checkpoint: {e}"),
            RunError::Backup(e) => e.fmt(f),
            RunError::Thread(e) => write!(f, "cannot start the backup thread: {e}"),
            RunError::NoAnswer => f.write_str("the backup thread ended without an answer"),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Hold(e) => Some(e),
            RunError::Subscriptions(e) | RunError::Backup(e) => Some(e),
            RunError::Checkpoint(e) => Some(e),
            RunError::Thread(e) => Some(e),
            RunError::NoAnswer => None,
        }
    }
}

/// The backup's steps; `Err` on failure (the directory stays, without a manifest: an
/// incomplete backup restore refuses).
async fn run(
    state: &Rc<AdminState>,
    asked: Asked,
    db: PathBuf,
    started_at_ms: i64,
) -> Result<Value, RunError> {
    let deadline = Instant::now() + asked.timeout;
    let hold = state
        .core
        .hold_gc(deadline.saturating_duration_since(Instant::now()))
        .await
        .map_err(RunError::Hold)?;
    let to = asked.to.clone();
    let subscriptions = state.subscriptions.clone();
    let subscriptions = off_core(move || copy_subscriptions(&to, subscriptions.as_ref()))
        .await?
        .map_err(RunError::Subscriptions)?;
    let left = deadline.saturating_duration_since(Instant::now());
    state
        .core
        .checkpoint(left)
        .await
        .map_err(RunError::Checkpoint)?;
    let checkpointed_at_ms = pico_engine::now_ms();
    let facts = json!({
        "startedAtMs": started_at_ms,
        "checkpointedAtMs": checkpointed_at_ms,
        "node": {
            "version": state.facts.build.version,
            "commit": state.facts.build.commit,
            "durability": state.facts.durability,
            "storage": state.facts.storage,
            "metaUrl": state.facts.meta_url,
            "nodeEpoch": state.facts.node_epoch_ms,
            "cores": state.facts.cores,
        },
    });
    let job = BackupJob {
        to: asked.to.clone(),
        db,
        source: state.core.store().clone(),
        deadline,
        max_bytes_per_second: asked.max_bytes_per_second,
        facts,
    };
    let summary = off_core(move || write_backup(&job, subscriptions))
        .await?
        .map_err(RunError::Backup)?;
    // Held until every object was copied; the collector resumes at its next interval.
    drop(hold);
    let finished_at_ms = pico_engine::now_ms();
    log::info!(
        "backup to {}: {} streams, {} objects ({} bytes), cut at {started_at_ms}",
        asked.to.display(),
        summary.streams,
        summary.objects,
        summary.object_bytes
    );
    Ok(json!({
        "to": asked.to.display().to_string(),
        "manifest": asked.to.join(crate::backup::MANIFEST_FILE).display().to_string(),
        "startedAtMs": started_at_ms,
        "checkpointedAtMs": checkpointed_at_ms,
        "catalogCopiedAtMs": summary.catalog_copied_at_ms,
        "finishedAtMs": finished_at_ms,
        "streams": summary.streams,
        "objects": summary.objects,
        "objectBytes": summary.object_bytes,
        "subscriptions": subscriptions,
        "skippedGarbage": summary.skipped_garbage,
    }))
}

/// Runs blocking work on a thread of its own (a backup may copy for minutes; glommio's
/// blocking pool is shared with the core's other file work) and awaits its answer; `Err`
/// when the thread could not start or gave no answer.
async fn off_core<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RunError> {
    let (reply, answer) = futures_channel::oneshot::channel();
    std::thread::Builder::new()
        .name("pico-backup".into())
        .spawn(move || {
            let _ = reply.send(work());
        })
        .map_err(RunError::Thread)?;
    answer.await.map_err(|_| RunError::NoAnswer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_stays_under_the_backup_dir() {
        let root = Path::new("/srv/backups");
        assert_eq!(
            resolve_destination(root, "nightly").unwrap(),
            PathBuf::from("/srv/backups/nightly")
        );
        assert_eq!(
            resolve_destination(root, "2026/12/05").unwrap(),
            PathBuf::from("/srv/backups/2026/12/05")
        );
        assert_eq!(
            resolve_destination(root, "/srv/backups/nightly").unwrap(),
            PathBuf::from("/srv/backups/nightly")
        );
        for outside in [
            "",
            "..",
            "../etc",
            "a/../../etc",
            "./a",
            "/etc/passwd",
            "/srv/backups",
            "/srv/backups/../etc",
            "/srv/backupsx/a",
        ] {
            assert!(
                resolve_destination(root, outside).is_err(),
                "{outside:?} was accepted"
            );
        }
        let long = "a/".repeat(BACKUP_DESTINATION_BYTES_MAX);
        assert!(resolve_destination(root, &long).is_err());
    }
}
