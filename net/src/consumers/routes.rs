//! The routes of named consumers in both protocols: each request is parsed into a [`Call`],
//! authorized, given the tails an ack needs, and decided by the metadata thread in its
//! transaction (`rules.rs`); the answer is rendered in the request's dialect (`view.rs`).
//!
//! Durable Streams: `{root}__ds/consumers[/{id}[/acquire|ack|release|wake]]` (see `mod.rs`).
//! Pico, on the reserved root `/` (a stream cannot be named `/`, so no stream name is
//! taken): `PUT|GET|DELETE /?consumer=NAME`, `POST /?consumer=NAME&action=acquire[&member=M]`,
//! `POST /?consumer=NAME&action=ack|release`. A Pico consumer's NAME is a path, and a token
//! reaches it where its grant covers that path.

use std::rc::Rc;

use pico_engine::{CoreHandle, EngineError};
use pico_proto::offset::Offset;
use serde_json::Value;

use super::rules::{self, AckOffsets, ConsumerError, Registration, Token};
use super::view::{self, Dialect};
use super::wake::{self, Wake};
use super::waker::ConsumerWakes;
use crate::auth::{bearer, CoreTokens, Permission};
use crate::params::query_param;
use crate::subscriptions::percent::encode_component;
use crate::subscriptions::Subscriptions;
use crate::transport::message::{Request, Response};

/// The metadata-log scope of Pico consumers (Durable Streams ones are scoped by their root,
/// which starts with '/', so the two never meet).
const PICO_SCOPE: &str = "";

/// One consumer request, parsed.
enum Call {
    Register(Registration),
    Describe,
    Delete,
    Acquire {
        member: Option<String>,
    },
    Ack {
        token: String,
        offsets: AckOffsets,
    },
    Release {
        token: String,
    },
    /// Sets (`Some`) or removes the wake webhook.
    SetWake(Option<Wake>),
}

/// What a consumer request needs from the node beyond its core.
pub struct Node<'a> {
    pub core: &'a Rc<CoreHandle>,
    pub auth: Option<&'a CoreTokens>,
    /// The node's webhook service: wake URLs follow its policy.
    pub subscriptions: &'a Subscriptions,
    pub wakes: &'a ConsumerWakes,
    /// `scheme://host` of the request, for the callback a wake names.
    pub base_url: String,
}

enum Reply {
    Answer(u16, Value),
    /// An ack names a stream another node owns: that node knows its tail.
    Moved(String),
}

fn json_body(request: &Request) -> Result<Value, ConsumerError> {
    crate::params::control_json(&request.body)
        .map_err(|(status, code, message)| ConsumerError::new(status, code, message))
}

/// The header a holder's token may also travel in: unlike `Authorization`, clients keep it
/// when they follow a redirect to another node (an ack of a stream another node serves).
pub const CONSUMER_TOKEN_HEADER: &str = "pico-consumer-token";

fn holder_token(request: &Request) -> Result<String, ConsumerError> {
    if let Some(token) = request
        .header(CONSUMER_TOKEN_HEADER)
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        return Ok(token.to_string());
    }
    crate::params::bearer_text(request)
        .map(str::to_string)
        .ok_or_else(|| {
            ConsumerError::new(
                401,
                "TOKEN_REQUIRED",
                "this call needs the consumer's token: Authorization: Bearer <token from acquire> \
                 (or Pico-Consumer-Token: <token>)",
            )
        })
}

fn not_allowed(allow: &'static str) -> ConsumerError {
    ConsumerError::new(405, "METHOD_NOT_ALLOWED", format!("allowed: {allow}"))
}

fn not_found_route() -> ConsumerError {
    ConsumerError::new(404, "NOT_FOUND", "consumer route not found")
}

/// The node's grants: every call but the holder's own needs `read` on each of `paths`.
fn authorize(
    auth: Option<&CoreTokens>,
    request: &Request,
    paths: &[&str],
) -> Result<(), ConsumerError> {
    let Some(auth) = auth else { return Ok(()) };
    let token = bearer(request.header("authorization"));
    for path in paths {
        auth.check(token, Permission::Read, path).map_err(|_| {
            let (status, code) = match token {
                None => (401, "UNAUTHORIZED"),
                Some(_) => (403, "FORBIDDEN"),
            };
            ConsumerError::new(
                status,
                code,
                format!("consumers need a token that may read {path}"),
            )
        })?;
    }
    Ok(())
}

/// Answers `{root}__ds/{rest}` where `rest` is `consumers` or starts `consumers/`; `root`
/// ends with '/'.
pub async fn handle_ds(node: Node<'_>, root: &str, rest: &str, request: &Request) -> Response {
    let auth = node.auth;
    let answer = async {
        let (id, call) = parse_ds(&node, root, rest, request)?;
        match &call {
            Call::Register(registration) => {
                let mut paths = vec![request.path.as_str()];
                paths.extend(registration.streams.iter().map(String::as_str));
                authorize(auth, request, &paths)?;
            }
            Call::Ack { .. } | Call::Release { .. } => {}
            _ => authorize(auth, request, &[request.path.as_str()])?,
        }
        run(&node, root, &id, call, Dialect::DurableStreams).await
    }
    .await;
    respond(answer, Dialect::DurableStreams)
}

/// The wake a `PUT …/wake` body asks for, its URL checked against the webhook URL policy.
fn wake_of(node: &Node<'_>, request: &Request, callback: String) -> Result<Wake, ConsumerError> {
    let url = wake::parse_request(&json_body(request)?)?;
    node.subscriptions
        .check_webhook_url(&url)
        .map_err(|e| ConsumerError::invalid(format!("url: {e}")))?;
    Ok(Wake {
        kind: "webhook".into(),
        url,
        callback,
    })
}

fn parse_ds(
    node: &Node<'_>,
    root: &str,
    rest: &str,
    request: &Request,
) -> Result<(String, Call), ConsumerError> {
    let method = request.method.as_str();
    if rest == "consumers" {
        if method != "POST" {
            return Err(not_allowed("POST"));
        }
        let (id, registration) = rules::parse_registration(&json_body(request)?)?;
        if let Some(outside) = registration.streams.iter().find(|p| !p.starts_with(root)) {
            return Err(ConsumerError::invalid(format!(
                "{outside} is not under this consumer's root {root}"
            )));
        }
        return Ok((id, Call::Register(registration)));
    }
    let route = rest
        .strip_prefix("consumers/")
        .ok_or_else(not_found_route)?;
    let (raw_id, action) = route.split_once('/').unwrap_or((route, ""));
    let id = crate::subscriptions::percent::decode_component(raw_id)
        .ok_or_else(|| ConsumerError::invalid("malformed percent-encoding in the consumer id"))?;
    rules::check_id(&id)?;
    let call = match (action, method) {
        ("", "GET") => Call::Describe,
        ("", "DELETE") => Call::Delete,
        ("", _) => return Err(not_allowed("GET, DELETE")),
        ("acquire", "POST") => Call::Acquire { member: None },
        ("ack", "POST") => Call::Ack {
            token: holder_token(request)?,
            offsets: rules::parse_ack(&json_body(request)?)?,
        },
        ("release", "POST") => Call::Release {
            token: holder_token(request)?,
        },
        ("wake", "PUT") => {
            let callback = format!(
                "{}{root}__ds/consumers/{}/ack",
                node.base_url,
                encode_component(&id)
            );
            Call::SetWake(Some(wake_of(node, request, callback)?))
        }
        ("wake", "DELETE") => Call::SetWake(None),
        ("acquire" | "ack" | "release", _) => return Err(not_allowed("POST")),
        ("wake", _) => return Err(not_allowed("PUT, DELETE")),
        _ => return Err(not_found_route()),
    };
    Ok((id, call))
}

/// Whether a Pico request is a consumer call: `/` with a `consumer` parameter.
pub fn is_pico_call(request: &Request) -> bool {
    request.path == "/" && query_param(&request.query, "consumer").is_some()
}

/// Answers a Pico consumer call ([`is_pico_call`]).
pub async fn handle_pico(node: Node<'_>, request: &Request) -> Response {
    let auth = node.auth;
    let answer = async {
        let (name, call) = parse_pico(&node, request)?;
        match &call {
            Call::Register(registration) => {
                let mut paths = vec![name.as_str()];
                paths.extend(registration.streams.iter().map(String::as_str));
                authorize(auth, request, &paths)?;
            }
            Call::Ack { .. } | Call::Release { .. } => {}
            _ => authorize(auth, request, &[name.as_str()])?,
        }
        run(&node, PICO_SCOPE, &name, call, Dialect::Pico).await
    }
    .await;
    respond(answer, Dialect::Pico)
}

fn parse_pico(node: &Node<'_>, request: &Request) -> Result<(String, Call), ConsumerError> {
    let name = query_param(&request.query, "consumer").unwrap_or_default();
    if !name.starts_with('/') {
        return Err(ConsumerError::invalid(
            "a consumer is named by a path: ?consumer=/team/billing",
        ));
    }
    rules::check_id(&name)?;
    let action = query_param(&request.query, "action");
    let call = match (request.method.as_str(), action.as_deref()) {
        ("PUT", None) => Call::Register(rules::parse_settings(&json_body(request)?, true)?),
        ("GET", None) => Call::Describe,
        ("DELETE", None) => Call::Delete,
        ("POST", Some("acquire")) => Call::Acquire {
            member: query_param(&request.query, "member"),
        },
        ("POST", Some("ack")) => Call::Ack {
            token: holder_token(request)?,
            offsets: parse_pico_ack(&json_body(request)?)?,
        },
        ("POST", Some("release")) => Call::Release {
            token: holder_token(request)?,
        },
        ("PUT", Some("wake")) => {
            let callback = format!(
                "{}/?consumer={}&action=ack",
                node.base_url,
                encode_component(&name)
            );
            Call::SetWake(Some(wake_of(node, request, callback)?))
        }
        ("DELETE", Some("wake")) => Call::SetWake(None),
        ("POST", Some(other)) => {
            return Err(ConsumerError::invalid(format!(
                "unknown action {other:?}: acquire, ack or release"
            )))
        }
        ("POST", None) => {
            return Err(ConsumerError::invalid(
                "a POST to a consumer names its action: &action=acquire|ack|release",
            ))
        }
        (_, Some("wake")) => return Err(not_allowed("PUT, DELETE")),
        (_, Some(_)) => return Err(not_allowed("POST")),
        _ => return Err(not_allowed("PUT, GET, DELETE, POST")),
    };
    if !matches!(call, Call::Acquire { .. }) && query_param(&request.query, "member").is_some() {
        return Err(ConsumerError::invalid("member belongs to action=acquire"));
    }
    Ok((name, call))
}

/// A Pico ack: `{"offsets":[{"stream": PATH, "offset": N}]}`, `N` the last record processed
/// (inclusive; `-1`: none).
fn parse_pico_ack(body: &Value) -> Result<AckOffsets, ConsumerError> {
    let list = body
        .get("offsets")
        .and_then(Value::as_array)
        .ok_or_else(|| ConsumerError::invalid("offsets (an array) is required"))?;
    if list.len() > rules::STREAMS_PER_CONSUMER_MAX {
        return Err(ConsumerError::invalid(format!(
            "an ack names at most {} streams",
            rules::STREAMS_PER_CONSUMER_MAX
        )));
    }
    list.iter()
        .map(|entry| {
            let stream = entry.get("stream").and_then(Value::as_str);
            let offset = entry.get("offset").and_then(Value::as_i64);
            match (stream, offset) {
                (Some(stream), Some(-1)) => Ok((stream.to_string(), Offset::Start)),
                (Some(stream), Some(last)) if last >= 0 => Ok((
                    stream.to_string(),
                    Offset::At {
                        // `last` is at most i64::MAX, so `+ 1` fits a u64.
                        seq: last as u64 + 1,
                        bytes: 0,
                    },
                )),
                _ => Err(ConsumerError::invalid(
                    "every offsets entry needs a stream (a path) and an offset (an integer >= -1)",
                )),
            }
        })
        .collect()
}

fn respond(answer: Result<Reply, ConsumerError>, dialect: Dialect) -> Response {
    match answer {
        Ok(Reply::Answer(status, body)) => {
            let response = Response::new(status).header("cache-control", "no-store");
            if status == 204 {
                return response;
            }
            response
                .header("content-type", "application/json")
                .with_body(body.to_string())
        }
        Ok(Reply::Moved(location)) => Response::new(crate::routing::REDIRECT_STATUS)
            .header("location", location)
            .header("cache-control", "no-store"),
        Err(error) => error_response(&error, dialect),
    }
}

fn error_response(error: &ConsumerError, dialect: Dialect) -> Response {
    let mut response = match dialect {
        Dialect::DurableStreams => Response::new(error.status)
            .header("content-type", "application/json")
            .header("cache-control", "no-store")
            .with_body(error.to_json().to_string()),
        Dialect::Pico => crate::pico::error::error_response(
            error.status,
            &view::pico_code(error),
            &error.message,
            None,
        ),
    };
    if error.status == 401 {
        response = response.header("www-authenticate", "Bearer");
    }
    if error.status == 503 || error.status == 429 {
        response = response.header("retry-after", "1");
    }
    if error.status == 405 {
        let allow = error.message.trim_start_matches("allowed: ").to_string();
        response = response.header("allow", allow);
    }
    response
}

/// Runs `call` on consumer `id` of `scope`.
async fn run(
    node: &Node<'_>,
    scope: &str,
    id: &str,
    call: Call,
    dialect: Dialect,
) -> Result<Reply, ConsumerError> {
    let core = node.core;
    let meta = core.meta();
    let scope_name = scope;
    let (scope, key) = (scope.to_string(), id.to_string());
    let decided = match call {
        Call::Register(registration) => {
            let id = id.to_string();
            let streams = registration.streams.clone();
            meta.change_consumer_following(
                scope,
                key,
                move |_| streams,
                move |read| rules::register(read, &id, &registration),
            )
            .await
        }
        Call::Describe => {
            meta.change_consumer_following(scope, key, rules::followed, rules::describe)
                .await
        }
        Call::Delete => meta.change_consumer(scope, key, rules::delete).await,
        Call::Acquire { member } => {
            let token = Token::random()?;
            meta.change_consumer_following(scope, key, rules::followed, move |read| {
                rules::acquire(read, member.as_deref(), &token)
            })
            .await
        }
        Call::Ack { token, offsets } => {
            let tails = match tails(core, &offsets, dialect).await? {
                Tails::Here(tails) => tails,
                Tails::Moved(location) => return Ok(Reply::Moved(location)),
            };
            meta.change_consumer_following(scope, key, rules::followed, move |read| {
                rules::ack(read, &token, &offsets, &tails)
            })
            .await
        }
        Call::Release { token } => {
            meta.change_consumer_following(scope, key, rules::followed, move |read| {
                rules::release(read, &token)
            })
            .await
        }
        Call::SetWake(wake) => {
            meta.change_consumer_following(scope, key, rules::followed, move |read| {
                wake::set(read, wake)
            })
            .await
        }
    };
    let outcome = decided
        .map_err(|_| meta_error(&pico_meta::MetaError::Closed))?
        .map_err(|e| meta_error(&e))??;
    node.wakes.observe(scope_name, id, &outcome);
    let body = view::render(&outcome, id, dialect);
    Ok(Reply::Answer(outcome.status, body))
}

fn meta_error(e: &pico_meta::MetaError) -> ConsumerError {
    ConsumerError::new(
        503,
        "UNAVAILABLE",
        format!("metadata log: {e} (where the outcome is unknown, read the consumer back)"),
    )
}

/// Where the tails of the streams an ack names are known.
enum Tails {
    /// On this node: each stream's tail (`None`: no such stream).
    Here(Vec<Option<rules::Tail>>),
    /// Another node owns one of them, at this location: it answers the ack, knowing the tail.
    Moved(String),
}

/// The tail of every stream an ack names, read from the owning cores.
async fn tails(
    core: &Rc<CoreHandle>,
    offsets: &AckOffsets,
    dialect: Dialect,
) -> Result<Tails, ConsumerError> {
    let mut tails = Vec::with_capacity(offsets.len());
    for (path, at) in offsets {
        if *at == Offset::Start {
            // `-1` is within every stream, existing or not.
            tails.push(None);
            continue;
        }
        match core.head(path).await {
            Ok(info) => tails.push(Some(rules::Tail {
                at: (info.next_offset, 0),
                incarnation: info.id,
            })),
            Err(EngineError::NotFound | EngineError::Gone) => tails.push(None),
            Err(EngineError::Moved {
                address,
                ds_address,
                ..
            }) => {
                let location = match dialect {
                    Dialect::DurableStreams => ds_address,
                    Dialect::Pico => address,
                };
                if location.is_empty() {
                    return Err(ConsumerError::new(
                        503,
                        "UNAVAILABLE",
                        format!("{path} is served by a node without this protocol's listener"),
                    ));
                }
                return Ok(Tails::Moved(location));
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
    Ok(Tails::Here(tails))
}
