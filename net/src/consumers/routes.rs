//! The Durable Streams routes of named consumers: parse, authorize, read the tails an ack
//! needs, and let the metadata thread run the decision (`state.rs`) in its transaction.

use std::rc::Rc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use pico_engine::{CoreHandle, EngineError};
use pico_meta::MetaError;
use pico_proto::offset::Offset;
use ring::rand::SecureRandom;
use serde_json::Value;

use super::state::{self, Answer, ConsumerError, Token};
use crate::auth::{bearer, CoreTokens, Permission};
use crate::limits::CONTROL_BODY_BYTES_MAX;
use crate::transport::message::{Request, Response};

/// Bytes of randomness in a holder's token.
const TOKEN_SECRET_BYTES: usize = 32;

fn json_response(status: u16, body: &Value) -> Response {
    let response = Response::new(status).header("cache-control", "no-store");
    if status == 204 {
        return response;
    }
    response
        .header("content-type", "application/json")
        .with_body(body.to_string())
}

fn error_response(error: &ConsumerError) -> Response {
    let mut response = json_response(error.status, &error.to_json());
    if error.status == 401 {
        response = response.header("www-authenticate", "Bearer");
    }
    if error.status == 503 || error.status == 429 {
        response = response.header("retry-after", "1");
    }
    response
}

fn json_body(request: &Request) -> Result<Value, ConsumerError> {
    if request.body.len() > CONTROL_BODY_BYTES_MAX {
        return Err(ConsumerError::new(
            413,
            "LIMIT_EXCEEDED",
            format!("control request bodies are at most {CONTROL_BODY_BYTES_MAX} bytes"),
        ));
    }
    if request.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_slice(&request.body).map_err(|_| ConsumerError::invalid("Invalid JSON body"))
}

fn holder_token(request: &Request) -> Result<&str, ConsumerError> {
    request
        .header("authorization")
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ConsumerError::new(
                401,
                "TOKEN_REQUIRED",
                "this call needs the consumer's token: Authorization: Bearer <token from acquire>",
            )
        })
}

fn meta_error(e: MetaError) -> ConsumerError {
    ConsumerError::new(
        503,
        "UNAVAILABLE",
        format!(
            "metadata log: {e} (the outcome is unknown when it says so: read the consumer back)"
        ),
    )
}

/// Answers `{root}__ds/{rest}` where `rest` is `consumers` or starts `consumers/`; `root`
/// ends with '/'.
pub async fn handle_ds(
    core: &Rc<CoreHandle>,
    auth: Option<&CoreTokens>,
    root: &str,
    rest: &str,
    request: &Request,
) -> Response {
    match route(core, auth, root, rest, request).await {
        Ok(Reply::Answer(status, body)) => json_response(status, &body),
        Ok(Reply::Moved(location)) => Response::new(crate::routing::REDIRECT_STATUS)
            .header("location", location)
            .header("cache-control", "no-store"),
        Err(e) if e.status == 405 => {
            let allow = e.message.trim_start_matches("allowed: ").to_string();
            error_response(&e).header("allow", allow)
        }
        Err(e) => error_response(&e),
    }
}

enum Reply {
    Answer(u16, Value),
    /// An ack names a stream another node owns: that node knows its tail.
    Moved(String),
}

fn answered(answer: Answer) -> Result<Reply, ConsumerError> {
    answer.map(|(status, body)| Reply::Answer(status, body))
}

/// The node's grants: every call but the holder's own needs `read` on the path it names
/// (which lies under the consumer's root), and a registration `read` on every stream.
fn authorize(
    auth: Option<&CoreTokens>,
    request: &Request,
    paths: &[&str],
) -> Result<(), ConsumerError> {
    let Some(auth) = auth else { return Ok(()) };
    let token = bearer(request.header("authorization"));
    for path in std::iter::once(request.path.as_str()).chain(paths.iter().copied()) {
        auth.check(token, Permission::Read, path).map_err(|_| {
            ConsumerError::new(
                if token.is_none() { 401 } else { 403 },
                if token.is_none() {
                    "UNAUTHORIZED"
                } else {
                    "FORBIDDEN"
                },
                format!("consumers need a token that may read {path}"),
            )
        })?;
    }
    Ok(())
}

async fn route(
    core: &Rc<CoreHandle>,
    auth: Option<&CoreTokens>,
    root: &str,
    rest: &str,
    request: &Request,
) -> Result<Reply, ConsumerError> {
    let method = request.method.as_str();
    let meta = core.meta();
    let scope = root.to_string();
    if rest == "consumers" {
        if method != "POST" {
            return Err(not_allowed("POST"));
        }
        let (id, registration) = state::parse_registration(&json_body(request)?)?;
        if let Some(outside) = registration.streams.iter().find(|p| !p.starts_with(root)) {
            return Err(ConsumerError::invalid(format!(
                "{outside} is not under this consumer's root {root}"
            )));
        }
        let paths: Vec<&str> = registration.streams.iter().map(String::as_str).collect();
        authorize(auth, request, &paths)?;
        let answer = meta
            .change_consumer(scope, id.clone(), move |read| {
                state::register(read, &id, &registration)
            })
            .await
            .map_err(|_| meta_error(MetaError::Closed))?
            .map_err(meta_error)?;
        return answered(answer);
    }
    let route = rest.strip_prefix("consumers/").ok_or_else(|| {
        ConsumerError::new(404, "NOT_FOUND", "Durable Streams control route not found")
    })?;
    let (raw_id, action) = route.split_once('/').unwrap_or((route, ""));
    let id = crate::ds::subscriptions::percent::decode_component(raw_id)
        .ok_or_else(|| ConsumerError::invalid("malformed percent-encoding in the consumer id"))?;
    state::check_id(&id)?;
    if !matches!(action, "ack" | "release") {
        authorize(auth, request, &[])?;
    }
    let answer = match (action, method) {
        ("", "GET") => {
            let id2 = id.clone();
            meta.change_consumer(scope, id, move |read| state::describe(read, &id2))
                .await
        }
        ("", "DELETE") => meta.change_consumer(scope, id, state::delete).await,
        ("", _) => return Err(not_allowed("GET, DELETE")),
        ("acquire", "POST") => {
            let token = Token::new(secret()?);
            let id2 = id.clone();
            meta.change_consumer(scope, id, move |read| state::acquire(read, &id2, &token))
                .await
        }
        ("ack", "POST") => {
            let token = holder_token(request)?.to_string();
            let offsets = state::parse_ack(&json_body(request)?)?;
            let tails = match tails(core, &offsets).await? {
                Ok(tails) => tails,
                Err(location) => return Ok(Reply::Moved(location)),
            };
            let id2 = id.clone();
            meta.change_consumer(scope, id, move |read| {
                state::ack(read, &id2, &token, &offsets, &tails)
            })
            .await
        }
        ("release", "POST") => {
            let token = holder_token(request)?.to_string();
            let id2 = id.clone();
            meta.change_consumer(scope, id, move |read| state::release(read, &id2, &token))
                .await
        }
        ("wake", "PUT") => {
            return Err(ConsumerError::new(
                501,
                "NOT_IMPLEMENTED",
                "wake webhooks for consumers are not served yet: poll, or use a subscription",
            ))
        }
        ("acquire" | "ack" | "release", _) => return Err(not_allowed("POST")),
        ("wake", _) => return Err(not_allowed("PUT")),
        _ => {
            return Err(ConsumerError::new(
                404,
                "NOT_FOUND",
                "Durable Streams control route not found",
            ))
        }
    };
    let answer = answer
        .map_err(|_| meta_error(MetaError::Closed))?
        .map_err(meta_error)?;
    answered(answer)
}

fn not_allowed(allow: &'static str) -> ConsumerError {
    ConsumerError::new(405, "METHOD_NOT_ALLOWED", format!("allowed: {allow}"))
}

/// An unguessable token secret from the system's random source.
fn secret() -> Result<String, ConsumerError> {
    let mut bytes = [0u8; TOKEN_SECRET_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| ConsumerError::new(503, "UNAVAILABLE", "no randomness for a token"))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// The tail of every stream an ack names (`None`: no such stream), read from the owning cores;
/// `Err(location)` when another node owns one (it answers the ack, knowing the tail).
async fn tails(
    core: &Rc<CoreHandle>,
    offsets: &state::AckOffsets,
) -> Result<Result<Vec<Option<(u64, u64)>>, String>, ConsumerError> {
    let mut tails = Vec::with_capacity(offsets.len());
    for (path, at) in offsets {
        if *at == Offset::Start {
            // `-1` is within every stream, existing or not.
            tails.push(None);
            continue;
        }
        match core.head(path).await {
            Ok(info) => tails.push(Some((info.next_offset, 0))),
            Err(EngineError::NotFound | EngineError::Gone) => tails.push(None),
            Err(EngineError::Moved { ds_address, .. }) if !ds_address.is_empty() => {
                return Ok(Err(ds_address))
            }
            Err(e) => {
                return Err(ConsumerError::new(
                    503,
                    "UNAVAILABLE",
                    format!("the tail of {path} is not known: {e}"),
                ))
            }
        }
    }
    Ok(Ok(tails))
}
