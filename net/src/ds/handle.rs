//! One Durable Streams request from start to answer: subscription control routes handed to
//! `subscriptions/`, the bearer token checked, the method routed to a read or a write, the
//! error rendered, the redirect completed.

use std::rc::Rc;

use pico_engine::{limits, CoreHandle};
use pico_proto::header::*;

use super::error::{refused, render_error, with_common, DsError};
use super::params::{base_url, fork_source_path, DsSettings};
use super::read::{head, read};
use super::write::{append, create, delete};
use crate::auth::{bearer, CoreTokens, Permission};
use crate::transport::message::{Request, Response};

pub(super) const ALLOW_METHODS: &str = "GET, POST, PUT, DELETE, HEAD, OPTIONS";
pub(super) const ALLOW_HEADERS: &str = "content-type, authorization, if-none-match, Stream-TTL, Stream-Expires-At, Stream-Closed, Stream-Seq, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset, Producer-Id, Producer-Epoch, Producer-Seq";

/// Where `/__ds/` (consumers and subscriptions) starts in `path`, if it does. A plain window
/// scan: `str::find` prepares a substring searcher first, which costs more than scanning a
/// stream's path, in every request.
fn control_at(path: &str) -> Option<usize> {
    path.as_bytes().windows(6).position(|w| w == b"/__ds/")
}

/// Answers one Durable Streams request.
pub async fn handle(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    auth: Option<&CoreTokens>,
    request: Request,
) -> Response {
    if let Some(at) = control_at(&request.path) {
        let rest = &request.path[at + "/__ds/".len()..];
        if request.method != "OPTIONS" && (rest == "consumers" || rest.starts_with("consumers/")) {
            let root = &request.path[..at + 1];
            let node = crate::consumers::Node {
                core,
                auth,
                subscriptions: &settings.subscriptions,
                wakes: &settings.consumer_wakes,
                base_url: base_url(settings, &request),
            };
            let mut response =
                Box::pin(crate::consumers::handle_ds(node, root, rest, &request)).await;
            crate::routing::complete_redirect(&mut response, &request);
            return with_common(response, &settings.cors_origin);
        }
        if request.method != "OPTIONS" {
            // Subscriptions watch many streams: with auth on they need an admin grant, except
            // the webhook callback and the lease calls, which carry their own bearer tokens.
            if let Err(error) = authorize_subscriptions(auth, &request) {
                return with_common(render_error(error), &settings.cors_origin);
            }
            let root = &request.path[..at + 1];
            let rest = &request.path[at + "/__ds/".len()..];
            let base_url = base_url(settings, &request);
            // What a subscription created here counts against: the admin grant that allows the
            // request (the tenant), or the root without auth.
            let scope = auth
                .zip(bearer(request.header("authorization")))
                .and_then(|(auth, token)| auth.scope(token, Permission::Admin, &request.path))
                .unwrap_or_else(|| root.to_string());
            let response = Box::pin(
                settings
                    .subscriptions
                    .handle(core, &base_url, root, &scope, rest, &request),
            )
            .await;
            return with_common(response, &settings.cors_origin);
        }
    }
    let result = match authorize(auth, &request).and_then(|()| own_protocol(settings, &request)) {
        Ok(()) => route(core, settings, &request).await,
        Err(error) => Err(error),
    };
    let mut response = result.unwrap_or_else(render_error);
    crate::routing::complete_redirect(&mut response, &request);
    with_common(response, &settings.cors_origin)
}

/// A Pico header or parameter is refused, not ignored (`crate::crossing`).
fn own_protocol(settings: &DsSettings, request: &Request) -> Result<(), DsError> {
    match crate::crossing::pico_only(request) {
        None => Ok(()),
        Some(what) => Err(DsError::new(
            400,
            "WRONG_PROTOCOL",
            crate::crossing::on_durable_streams_listener(&what, settings.pico.url(request)),
        )),
    }
}

/// With `--auth required` every request but a preflight needs a token
/// granted the operation on the stream.
pub(super) fn authorize(auth: Option<&CoreTokens>, request: &Request) -> Result<(), DsError> {
    let Some(auth) = auth else { return Ok(()) };
    let Some(permission) = Permission::for_method(&request.method) else {
        return Ok(());
    };
    let token = bearer(request.header("authorization"));
    auth.check(token, permission, &request.path)
        .map_err(|denied| refused(denied, "this token may not do that on this stream"))?;
    // A fork reads its source through the new stream: creating one needs `read` there too.
    if request.method == "PUT" {
        if let Some(source) = request.header(STREAM_FORKED_FROM) {
            auth.check(token, Permission::Read, fork_source_path(source))
                .map_err(|denied| refused(denied, "this token may not read the fork's source"))?;
        }
    }
    Ok(())
}

/// Whether `rest` (the path after `/__ds/`) is one of the control routes the protocol leaves
/// without a stream grant: the signing keys, and the webhook callback and lease calls, which
/// carry the subscription's own bearer token. Exact routes only: any other path under `__ds/`
/// (a subscription that happens to be named `callback`, say) needs the admin grant.
fn is_public_control_route(method: &str, rest: &str) -> bool {
    if rest == "jwks.json" {
        return method == "GET" || method == "HEAD";
    }
    let Some(route) = rest.strip_prefix("subscriptions/") else {
        return false;
    };
    match route.split_once('/') {
        Some((id, action)) => {
            method == "POST" && !id.is_empty() && matches!(action, "callback" | "ack" | "release")
        }
        None => false,
    }
}

fn authorize_subscriptions(auth: Option<&CoreTokens>, request: &Request) -> Result<(), DsError> {
    let Some(auth) = auth else { return Ok(()) };
    let rest = control_at(&request.path).map_or("", |at| &request.path[at + "/__ds/".len()..]);
    if is_public_control_route(&request.method, rest) {
        return Ok(());
    }
    auth.check(
        bearer(request.header("authorization")),
        Permission::Admin,
        &request.path,
    )
    .map_err(|denied| refused(denied, "subscriptions need an admin token"))
}

pub(super) async fn route(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    request: &Request,
) -> Result<Response, DsError> {
    if request.path.len() > limits::STREAM_NAME_LEN_MAX {
        return Err(DsError::bad_request(format!(
            "stream path longer than {} bytes",
            limits::STREAM_NAME_LEN_MAX
        )));
    }
    match request.method.as_str() {
        "OPTIONS" => Ok(Response::new(204)
            .header("access-control-allow-methods", ALLOW_METHODS)
            .header("access-control-allow-headers", ALLOW_HEADERS)
            .header("access-control-max-age", "86400")
            .header("cache-control", "no-store")),
        // RFC 9110: a 405 lists the methods the resource supports.
        _ if request.path == "/" => {
            Err(
                DsError::new(405, "METHOD_NOT_ALLOWED", "the root is not a stream")
                    .with("allow", "OPTIONS"),
            )
        }
        // Only reads wait (long-polls, SSE: thousands at once), so only a read's future is
        // inline; the others are on the heap while they run, not sizing every read's.
        "PUT" => Box::pin(create(core, settings, request)).await,
        "POST" => Box::pin(append(core, request)).await,
        "GET" => read(core, settings, request).await,
        "HEAD" => Box::pin(head(core, request)).await,
        "DELETE" => Box::pin(delete(core, request)).await,
        _ => Err(
            DsError::new(405, "METHOD_NOT_ALLOWED", "method not allowed")
                .with("allow", ALLOW_METHODS),
        ),
    }
}
