//! `POST /admin/verify` (docs/durability.md, "Verifying stored objects"): reads every object
//! the catalog keeps that a stream still reads and checks it as a reader would, before a
//! reader needs it: its size against its catalog row, every frame's CRC and layout, and that
//! it is there at all. Damage is otherwise found only when a read or a backup reaches it.
//!
//! Body `{"timeoutSec": n, "maxBytesPerSecond": n}`, both optional. Answered `202` once the
//! verify started; `GET /admin/verify` tells how the latest one stands (`running` with its
//! progress, `complete` with its report, `failed` with the error). One at a time (`409`).
//!
//! The objects are listed from the catalog (SQLite or Postgres) and read through the node's
//! own bucket client on a thread of its own, so serving goes on. An object that is gone when
//! its GET comes is asked about again: one the collector deleted meanwhile is no finding; one
//! a stream still needs is **missing**, which is damage.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::future::block_on;
use pico_meta::{MetaStore, StoredObject};
use pico_s3::{ObjectStore, StoreError};
use serde_json::{json, Value};

use crate::admin::shared::{error, job_bounds, json_response, AdminState};
use crate::backup::{pace_until, read_cataloged};
use crate::limits::{
    VERIFY_LISTED_DAMAGE_MAX, VERIFY_LOGGED_DAMAGE_MAX, VERIFY_TIMEOUT_SEC_DEFAULT,
    VERIFY_TIMEOUT_SEC_MAX, VERIFY_UNREADABLE_IN_A_ROW_MAX,
};
use crate::transport::message::{Request, Response};

/// The node's latest verify and the counters its thread moves while it runs.
#[derive(Default)]
pub struct VerifyStatus {
    /// `None` before the first verify.
    report: RefCell<Option<Value>>,
    /// The latest complete verify's damaged objects and when it finished (Unix ms): what
    /// `/metrics` keeps while the next one runs.
    last_complete: std::cell::Cell<Option<(u64, i64)>>,
    progress: Arc<Progress>,
}

#[derive(Default)]
struct Progress {
    objects: AtomicU64,
    bytes: AtomicU64,
}

impl VerifyStatus {
    fn running(&self) -> bool {
        self.report
            .borrow()
            .as_ref()
            .is_some_and(|report| report["state"] == "running")
    }

    fn json(&self) -> Value {
        let mut report = self
            .report
            .borrow()
            .clone()
            .unwrap_or_else(|| json!({ "state": "none" }));
        if report["state"] == "running" {
            report["objectsChecked"] = json!(self.progress.objects.load(Ordering::Relaxed));
            report["bytesChecked"] = json!(self.progress.bytes.load(Ordering::Relaxed));
        }
        report
    }

    /// `pico_verify_*` lines of `/metrics`: the latest complete verify's findings.
    pub fn metrics_text(&self) -> String {
        let Some((damaged, finished_ms)) = self.last_complete.get() else {
            return String::new();
        };
        format!(
            "# HELP pico_verify_damaged_objects Stored objects the latest complete verify found damaged or missing (pico admin verify).\n\
             # TYPE pico_verify_damaged_objects gauge\n\
             pico_verify_damaged_objects {damaged}\n\
             # HELP pico_verify_completed_timestamp_seconds When the latest complete verify finished (Unix time).\n\
             # TYPE pico_verify_completed_timestamp_seconds gauge\n\
             pico_verify_completed_timestamp_seconds {:.3}\n",
            finished_ms as f64 / 1000.0
        )
    }
}

/// `GET /admin/verify`.
pub(super) fn status(state: &AdminState) -> Response {
    json_response(200, state.verify.json())
}

/// What a request asks for, checked.
struct Asked {
    timeout: Duration,
    max_bytes_per_second: Option<u64>,
}

pub(super) fn verify(state: &Rc<AdminState>, request: &Request) -> Response {
    let asked = match parse(request) {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    if state.verify.running() {
        return error(
            409,
            "a verify of this node's objects is running; one at a time",
        );
    }
    let started_at_ms = pico_engine::now_ms();
    let running = json!({ "state": "running", "startedAtMs": started_at_ms });
    *state.verify.report.borrow_mut() = Some(running.clone());
    state.verify.progress.objects.store(0, Ordering::Relaxed);
    state.verify.progress.bytes.store(0, Ordering::Relaxed);
    let job = Job {
        meta: state.core.meta().clone(),
        store: state.core.store().clone(),
        deadline: Instant::now() + asked.timeout,
        max_bytes_per_second: asked.max_bytes_per_second,
        progress: state.verify.progress.clone(),
    };
    let task_state = state.clone();
    glommio::spawn_local(async move {
        let ended = match off_core(move || run(&job)).await {
            Ok(Ok(mut report)) => {
                let finished_at_ms = pico_engine::now_ms();
                let damaged = report["damagedObjects"].as_u64().unwrap_or(0);
                task_state
                    .verify
                    .last_complete
                    .set(Some((damaged, finished_at_ms)));
                report["state"] = json!("complete");
                report["startedAtMs"] = json!(started_at_ms);
                report["finishedAtMs"] = json!(finished_at_ms);
                report
            }
            Ok(Err(e)) | Err(e) => {
                log::warn!("verify of the stored objects failed: {e}");
                json!({
                    "state": "failed",
                    "startedAtMs": started_at_ms,
                    "finishedAtMs": pico_engine::now_ms(),
                    "error": e,
                })
            }
        };
        *task_state.verify.report.borrow_mut() = Some(ended);
    })
    .detach();
    json_response(202, running)
}

fn parse(request: &Request) -> Result<Asked, Response> {
    let body: Value = if request.body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(&request.body)
            .map_err(|e| error(400, format!("invalid JSON body: {e}")))?
    };
    if !body.is_object() {
        return Err(error(400, "the body must be a JSON object"));
    }
    let (timeout, max_bytes_per_second) =
        job_bounds(&body, VERIFY_TIMEOUT_SEC_DEFAULT, VERIFY_TIMEOUT_SEC_MAX)?;
    Ok(Asked {
        timeout,
        max_bytes_per_second,
    })
}

/// What the verify's thread needs.
struct Job {
    meta: MetaStore,
    store: ObjectStore,
    deadline: Instant,
    max_bytes_per_second: Option<u64>,
    progress: Arc<Progress>,
}

/// What reading one object found.
#[derive(Debug, PartialEq, Eq)]
enum Finding {
    Intact,
    /// Its bytes fail a check: `at` is the first byte a reader cannot trust; `readable` maps
    /// each stream with an intact record before it to the offset after its last such record.
    Damaged {
        cause: String,
        at: u64,
        readable: HashMap<u64, u64>,
    },
    /// Not in the bucket (damage only if a stream still needs it: asked again).
    Gone,
    /// The bucket did not answer (an outage, not damage).
    Unreadable(String),
}

/// Reads `object` whole and checks it as a reader would; `bytes` read.
fn check(store: &ObjectStore, object: &StoredObject) -> Result<(Finding, u64), String> {
    let bytes = match read_cataloged(store, &object.key, object.size_bytes) {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(StoreError::NotFound(_))) => return Ok((Finding::Gone, 0)),
        Ok(Err(e)) => return Ok((Finding::Unreadable(e.to_string()), 0)),
        Err(_) => return Err("the node's bucket client stopped".to_string()),
    };
    let read = bytes.len() as u64;
    let damage = pico_engine::frame::first_damage(&bytes);
    let (at, cause) = match (object.size_bytes, damage) {
        (Some(size), damage) if read < size => (
            damage.map_or(read, |(at, _)| at as u64),
            format!("it holds {read} bytes, its catalog entry says {size}"),
        ),
        (_, Some((at, e))) => (
            at as u64,
            format!("its frame at byte {at} fails its checks ({e:?})"),
        ),
        (_, None) => return Ok((Finding::Intact, read)),
    };
    let readable = readable_before(&bytes, at as usize);
    Ok((
        Finding::Damaged {
            cause,
            at,
            readable,
        },
        read,
    ))
}

/// For each stream with a record frame wholly before byte `at` of `bytes` (all intact), the
/// offset after its last one: where its readers' answers stop.
fn readable_before(bytes: &[u8], at: usize) -> HashMap<u64, u64> {
    use pico_engine::frame::{check_frame, FRAME_KIND_RECORD};
    let mut next = HashMap::new();
    let mut pos = 0;
    while pos < at {
        let Ok((header, len)) = check_frame(bytes, pos) else {
            break;
        };
        if header.kind == FRAME_KIND_RECORD {
            let after = header.offset.get().saturating_add(1);
            let entry = next.entry(header.stream_id.get()).or_insert(after);
            *entry = (*entry).max(after);
        }
        pos += len;
    }
    next
}

/// A damaged object of the report.
struct Damage {
    key: String,
    cause: String,
    at: u64,
    readable: HashMap<u64, u64>,
    object: StoredObject,
}

impl Damage {
    /// The records readers cannot get: `(stream, from, next)` of each run that ends past the
    /// first untrusted byte, from its first record not wholly before it.
    fn lost(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.object
            .runs
            .iter()
            .filter(|r| r.run.byte_end > self.at)
            .map(|r| {
                let from = match self.readable.get(&r.stream_id) {
                    Some(&next) if r.run.byte_start < self.at => next.max(r.run.first_offset),
                    _ => r.run.first_offset,
                };
                (r.stream_id, from, r.run.next_offset)
            })
    }
}

/// The verify itself: list, read and check, ask again about what was gone, name the streams.
fn run(job: &Job) -> Result<Value, String> {
    let objects = block_on(job.meta.stored_objects(None))
        .map_err(|_| "the metadata log stopped".to_string())?
        .map_err(|e| format!("cannot list the catalog's objects: {e}"))?;
    let started = Instant::now();
    let (mut bytes, mut intact, mut collected) = (0u64, 0u64, 0u64);
    let mut damaged: Vec<Damage> = Vec::new();
    let mut unreadable: Vec<Value> = Vec::new();
    let mut unreadable_in_a_row = 0;
    for object in objects {
        // Paced before each read, so the last one's answer is not held back.
        if let Some(wake) = pace_until(started, bytes, job.max_bytes_per_second) {
            if wake > job.deadline {
                return Err(format!(
                    "{bytes} bytes at maxBytesPerSecond {} do not fit in timeoutSec",
                    job.max_bytes_per_second.unwrap_or(0)
                ));
            }
            std::thread::sleep(wake.saturating_duration_since(Instant::now()));
        }
        if Instant::now() >= job.deadline {
            return Err(format!(
                "out of time after {} of the objects; raise timeoutSec",
                job.progress.objects.load(Ordering::Relaxed)
            ));
        }
        let (finding, read) = check(&job.store, &object)?;
        bytes = bytes.saturating_add(read);
        job.progress.objects.fetch_add(1, Ordering::Relaxed);
        job.progress.bytes.fetch_add(read, Ordering::Relaxed);
        if !matches!(finding, Finding::Unreadable(_)) {
            unreadable_in_a_row = 0;
        }
        match finding {
            Finding::Intact => intact += 1,
            Finding::Damaged {
                cause,
                at,
                readable,
            } => damaged.push(Damage {
                key: object.key.clone(),
                cause,
                at,
                readable,
                object,
            }),
            Finding::Gone => {
                let still = block_on(job.meta.stored_objects(Some(object.key.clone())))
                    .map_err(|_| "the metadata log stopped".to_string())?
                    .map_err(|e| format!("cannot look {} up in the catalog: {e}", object.key))?;
                match still.into_iter().next() {
                    // Needed still: nothing deleted it by the rules. Its reads fail.
                    Some(object) => damaged.push(Damage {
                        key: object.key.clone(),
                        cause: "it is missing from the bucket".to_string(),
                        at: 0,
                        readable: HashMap::new(),
                        object,
                    }),
                    None => collected += 1,
                }
            }
            Finding::Unreadable(why) => {
                unreadable_in_a_row += 1;
                if unreadable_in_a_row >= VERIFY_UNREADABLE_IN_A_ROW_MAX {
                    return Err(format!(
                        "{unreadable_in_a_row} objects in a row could not be read; the last: {}: {why}",
                        object.key
                    ));
                }
                unreadable.push(json!({ "key": object.key, "error": why }));
            }
        }
    }
    let mut ids: Vec<u64> = damaged
        .iter()
        .flat_map(|d| d.object.runs.iter().map(|r| r.stream_id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let names: HashMap<u64, String> = if ids.is_empty() {
        Default::default()
    } else {
        block_on(job.meta.stream_names(ids))
            .map_err(|_| "the metadata log stopped".to_string())?
            .map_err(|e| format!("cannot name the damaged objects' streams: {e}"))?
            .into_iter()
            .collect()
    };
    let listed: Vec<Value> = damaged
        .iter()
        .take(VERIFY_LISTED_DAMAGE_MAX)
        .map(|d| damage_json(d, &names))
        .collect();
    for (i, d) in damaged.iter().enumerate() {
        if i == VERIFY_LOGGED_DAMAGE_MAX {
            log::error!(
                "verify: {} more damaged objects (GET /admin/verify lists up to {VERIFY_LISTED_DAMAGE_MAX})",
                damaged.len() - i
            );
            break;
        }
        log::error!(
            "verify: segment object {} is damaged: {}; readers cannot get {}",
            d.key,
            d.cause,
            lost_text(d, &names)
        );
    }
    let checked = intact + damaged.len() as u64 + unreadable.len() as u64 + collected;
    log::info!(
        "verify: {checked} objects ({bytes} bytes) read, {intact} intact, {} damaged, {} unreadable, {collected} collected meanwhile",
        damaged.len(),
        unreadable.len()
    );
    Ok(json!({
        "objectsChecked": checked,
        "bytesChecked": bytes,
        "intactObjects": intact,
        "damagedObjects": damaged.len(),
        "unreadableObjects": unreadable.len(),
        "collectedObjects": collected,
        "damaged": listed,
        "unreadable": unreadable.into_iter().take(VERIFY_LISTED_DAMAGE_MAX).collect::<Vec<_>>(),
    }))
}

fn stream_name(names: &HashMap<u64, String>, id: u64) -> String {
    names
        .get(&id)
        .cloned()
        .unwrap_or_else(|| format!("(stream id {id}, since deleted)"))
}

fn damage_json(d: &Damage, names: &HashMap<u64, String>) -> Value {
    let lost: Vec<Value> = d
        .lost()
        .map(|(id, from, next)| {
            json!({
                "stream": stream_name(names, id),
                "streamId": id,
                "fromOffset": from,
                "nextOffset": next,
            })
        })
        .collect();
    json!({ "key": d.key, "cause": d.cause, "atByte": d.at, "lost": lost })
}

fn lost_text(d: &Damage, names: &HashMap<u64, String>) -> String {
    let lost: Vec<String> = d
        .lost()
        .map(|(id, from, next)| format!("{} {from}..{next}", stream_name(names, id)))
        .collect();
    if lost.is_empty() {
        "no records (the damage is past every record readers reach)".to_string()
    } else {
        format!("records of {}", lost.join(", "))
    }
}

/// Runs the verify on a thread of its own (it may read for hours; glommio's blocking pool is
/// shared with the core's file work) and awaits its answer.
async fn off_core<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<Result<T, String>, String> {
    let (reply, answer) = futures_channel::oneshot::channel();
    std::thread::Builder::new()
        .name("pico-verify".into())
        .spawn(move || {
            let _ = reply.send(work());
        })
        .map_err(|e| format!("cannot start the verify thread: {e}"))?;
    answer
        .await
        .map_err(|_| "the verify thread ended without an answer".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pico_meta::{SegmentRun, StoredRun};

    fn object(key: &str, size: Option<u64>) -> StoredObject {
        StoredObject {
            key: key.to_string(),
            size_bytes: size,
            runs: vec![StoredRun {
                stream_id: 1,
                run: SegmentRun {
                    first_offset: 0,
                    next_offset: 2,
                    byte_start: 0,
                    byte_end: size.unwrap_or(0),
                },
            }],
        }
    }

    /// Two record frames of stream 1; the length of the first.
    fn two_frames() -> (Vec<u8>, u64) {
        use pico_engine::frame::{encode_frame, FrameMeta, FRAME_KIND_RECORD};
        let mut frames = Vec::new();
        let mut first = 0;
        for (offset, body) in [&b"first"[..], b"second"].into_iter().enumerate() {
            let meta = FrameMeta {
                kind: FRAME_KIND_RECORD,
                stream_id: 1,
                offset: offset as u64,
                timestamp_ms: 1,
                request_end: true,
                producer: None,
                writer_seq: None,
            };
            encode_frame(&mut frames, meta, &[], body);
            if offset == 0 {
                first = frames.len() as u64;
            }
        }
        (frames, first)
    }

    #[test]
    fn an_object_is_checked_for_its_size_its_frames_and_its_presence() {
        let uri = pico_s3::StorageUri::parse("0@mem://verify-check").unwrap();
        let store = ObjectStore::open(&uri).unwrap();
        let (frames, second) = two_frames();
        let len = frames.len() as u64;
        block_on(store.put("segments/ok.seg", frames.clone().into()))
            .unwrap()
            .unwrap();
        assert_eq!(
            check(&store, &object("segments/ok.seg", Some(len))).unwrap(),
            (Finding::Intact, len)
        );
        // Longer than its row: a compaction's merged object before its swap; the first bytes count.
        let mut longer = frames.clone();
        longer.extend_from_slice(b"not yet in the catalog");
        block_on(store.put("segments/longer.seg", longer.into()))
            .unwrap()
            .unwrap();
        assert_eq!(
            check(&store, &object("segments/longer.seg", Some(len)))
                .unwrap()
                .0,
            Finding::Intact
        );
        let (finding, _) = check(&store, &object("segments/ok.seg", Some(len + 1))).unwrap();
        assert!(
            matches!(&finding, Finding::Damaged { at, cause, .. } if *at == len && cause.contains("catalog entry says")),
            "{finding:?}"
        );
        let mut flipped = frames.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x01;
        block_on(store.put("segments/flipped.seg", flipped.into()))
            .unwrap()
            .unwrap();
        let (finding, _) = check(&store, &object("segments/flipped.seg", Some(len))).unwrap();
        // The first record reads; the second is where readers stop.
        let Finding::Damaged { at, readable, .. } = finding else {
            panic!("{finding:?}");
        };
        assert_eq!(at, second);
        assert_eq!(readable, HashMap::from([(1, 1)]));
        assert_eq!(
            check(&store, &object("segments/none.seg", Some(len)))
                .unwrap()
                .0,
            Finding::Gone
        );
    }
}
