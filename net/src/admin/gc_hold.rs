//! The pieces of a backup an operator runs by hand, for a cluster's backup procedure
//! (docs/backup.md, "Clusters"), where the catalog is Postgres and every node collects:
//!
//! - `POST /admin/gc-hold` `{"seconds": n}`: this node's garbage collector deletes nothing
//!   until `n` seconds pass or the hold is released (a round in progress ends first). A second
//!   `POST` sets a new end. `GET` says whether it is held; `DELETE` releases it.
//! - `POST /admin/checkpoint` `{"timeoutSec": n}`: every core stores and commits what only
//!   its WAL held; once answered, the catalog and the bucket hold every append this node
//!   acknowledged before the request.

use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::admin::shared::{error, json_response, AdminState, ManualHold, ManualHolds};
use crate::limits::{BACKUP_TIMEOUT_SEC_DEFAULT, BACKUP_TIMEOUT_SEC_MAX, GC_HOLD_WAIT_SEC};
use crate::transport::message::{Request, Response};

fn seconds_field(body: &Value, key: &str, default: Option<u64>) -> Result<u64, Response> {
    match body.get(key) {
        None | Some(Value::Null) => default.ok_or_else(|| error(400, format!("missing \"{key}\""))),
        Some(value) => match value.as_u64() {
            Some(n) if (1..=BACKUP_TIMEOUT_SEC_MAX).contains(&n) => Ok(n),
            _ => Err(error(
                400,
                format!("\"{key}\" must be an integer from 1 to {BACKUP_TIMEOUT_SEC_MAX}"),
            )),
        },
    }
}

fn body_or_empty(request: &Request) -> Result<Value, Response> {
    if request.body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&request.body).map_err(|e| error(400, format!("invalid JSON body: {e}")))
}

fn hold_json(holds: &ManualHolds) -> Value {
    match &*holds.current.borrow() {
        Some(hold) => json!({ "held": true, "untilMs": hold.until_ms }),
        None => json!({ "held": false, "untilMs": Value::Null }),
    }
}

pub(super) fn status(state: &AdminState) -> Response {
    json_response(200, hold_json(&state.gc_holds))
}

pub(super) async fn hold(state: &Rc<AdminState>, request: &Request) -> Response {
    let body = match body_or_empty(request) {
        Ok(body) => body,
        Err(response) => return response,
    };
    let seconds = match seconds_field(&body, "seconds", None) {
        Ok(seconds) => seconds,
        Err(response) => return response,
    };
    let gc_hold = match state
        .core
        .hold_gc(Duration::from_secs(GC_HOLD_WAIT_SEC))
        .await
    {
        Ok(hold) => hold,
        Err(e) => return error(503, e.to_string()),
    };
    let holds = &state.gc_holds;
    let generation = holds.generations.get() + 1;
    holds.generations.set(generation);
    let until_ms = pico_engine::now_ms().saturating_add((seconds * 1000) as i64);
    // A hold taken before is dropped here, after the new one counts: the collector never runs
    // in between.
    let previous = holds.current.borrow_mut().replace(ManualHold {
        _hold: gc_hold,
        until_ms,
        generation,
    });
    drop(previous);
    let timer_state = state.clone();
    let until = Instant::now() + Duration::from_secs(seconds);
    glommio::spawn_local(async move {
        glommio::timer::sleep(until.saturating_duration_since(Instant::now())).await;
        let holds = &timer_state.gc_holds;
        let expired = holds
            .current
            .borrow()
            .as_ref()
            .is_some_and(|hold| hold.generation == generation);
        if expired {
            holds.current.borrow_mut().take();
            log::info!("the garbage collector's manual hold ran out");
        }
    })
    .detach();
    log::info!("the garbage collector is held for {seconds} s (POST /admin/gc-hold)");
    json_response(200, hold_json(holds))
}

pub(super) fn release(state: &AdminState) -> Response {
    if state.gc_holds.current.borrow_mut().take().is_some() {
        log::info!("the garbage collector's manual hold is released");
    }
    json_response(200, hold_json(&state.gc_holds))
}

pub(super) async fn checkpoint(state: &AdminState, request: &Request) -> Response {
    let started_at_ms = pico_engine::now_ms();
    let body = match body_or_empty(request) {
        Ok(body) => body,
        Err(response) => return response,
    };
    let timeout_sec = match seconds_field(&body, "timeoutSec", Some(BACKUP_TIMEOUT_SEC_DEFAULT)) {
        Ok(seconds) => seconds,
        Err(response) => return response,
    };
    match state
        .core
        .checkpoint(Duration::from_secs(timeout_sec))
        .await
    {
        Ok(()) => json_response(
            200,
            json!({
                "startedAtMs": started_at_ms,
                "checkpointedAtMs": pico_engine::now_ms(),
            }),
        ),
        Err(e) => error(503, e.to_string()),
    }
}
