//! The admin listener: liveness and readiness probes (the admin API and metrics build on it).

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::http1::{Request, Response};

/// Node state the probes report.
#[derive(Default)]
pub struct AdminState {
    /// All cores started and listening; false again as soon as shutdown begins, so load
    /// balancers stop sending traffic during the drain window.
    pub serving: Arc<AtomicBool>,
}

pub async fn handle(state: &Rc<AdminState>, request: Request) -> Response {
    let json = |status: u16, body: String| {
        Response::new(status)
            .header("content-type", "application/json")
            .header("cache-control", "no-store")
            .with_body(body)
    };
    match (request.method.as_str(), request.path.as_str()) {
        ("GET" | "HEAD", "/health") => Response::new(200)
            .header("content-type", "text/plain")
            .header("cache-control", "no-store")
            .with_body("ok"),
        ("GET" | "HEAD", "/ready") => {
            let serving = state.serving.load(Ordering::Relaxed);
            let body = format!(
                "{{\"ready\":{serving},\"serving\":{serving},\"registered\":true,\"appliedIndex\":0,\"nodeId\":1}}"
            );
            json(if serving { 200 } else { 503 }, body)
        }
        ("GET" | "HEAD", path) => json(
            404,
            format!("{{\"error\":\"no such path {}\"}}", path.replace('"', "'")),
        ),
        _ => json(405, "{\"error\":\"method not allowed\"}".into()),
    }
}

pub fn connection_error(status: u16, message: &str) -> Response {
    Response::new(status)
        .header("content-type", "application/json")
        .with_body(format!(
            "{{\"error\":{}}}",
            serde_json::Value::String(message.to_string())
        ))
}
