//! One Pico request from start to answer: the bearer token checked, the method and path
//! routed to a read or a write, the error rendered, the redirect completed.

use std::rc::Rc;

use pico_engine::{limits, CoreHandle};

use super::error::{render_error, with_common, ApiError};
use super::read::{head, list, read};
use super::settings::PicoSettings;
use super::write::{append, configure, create, delete};
use crate::auth::{bearer, CoreTokens, Denied, Permission};
use crate::params::query_param;
use crate::transport::message::{Request, Response};

pub(super) const ALLOW_METHODS: &str = "GET, PUT, POST, PATCH, DELETE, HEAD, OPTIONS";
/// The methods `/` (the listing) supports.
const ROOT_ALLOW_METHODS: &str = "GET, OPTIONS";
pub(super) const ALLOW_HEADERS: &str = "content-type, authorization, if-none-match, last-event-id, Pico-Match-Seq, Pico-Trim-Seq, Pico-TTL, Pico-Expires-At, Pico-Closed, Pico-Producer-Id, Pico-Producer-Epoch, Pico-Producer-Seq, Pico-Retention-Age, Pico-Retention-Bytes, Pico-Delete-On-Empty, Pico-Consumer-Token";

/// Answers one Pico request.
pub async fn handle(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    auth: Option<&CoreTokens>,
    request: Request,
) -> Response {
    if crate::consumers::is_pico_call(&request) && request.method != "OPTIONS" {
        let node = crate::consumers::Node {
            core,
            auth,
            subscriptions: &settings.subscriptions,
            wakes: &settings.consumer_wakes,
            base_url: crate::params::base_url(settings.scheme, &request),
        };
        let mut response = Box::pin(crate::consumers::handle_pico(node, &request)).await;
        crate::routing::complete_redirect(&mut response, &request);
        return with_common(response, &settings.cors_origin);
    }
    let result = match authorize(auth, &request).and_then(|()| own_protocol(settings, &request)) {
        Ok(()) => route(core, settings, &request).await,
        Err(error) => Err(error),
    };
    let mut response = result.unwrap_or_else(render_error);
    crate::routing::complete_redirect(&mut response, &request);
    with_common(response, &settings.cors_origin)
}

/// A Durable Streams header or parameter is refused, not ignored (`crate::crossing`).
fn own_protocol(settings: &PicoSettings, request: &Request) -> Result<(), ApiError> {
    match crate::crossing::durable_streams_only(request) {
        None => Ok(()),
        Some(what) => Err(ApiError::new(
            400,
            "wrong_protocol",
            crate::crossing::on_pico_listener(&what, settings.durable_streams.url(request)),
        )),
    }
}

/// With `--auth required`, every request but a CORS preflight needs a bearer token
/// granted the operation on the stream (for a listing, on the listed prefix).
pub(super) fn authorize(auth: Option<&CoreTokens>, request: &Request) -> Result<(), ApiError> {
    let Some(auth) = auth else { return Ok(()) };
    let Some(permission) = Permission::for_method(&request.method) else {
        return Ok(());
    };
    let name = if request.path == "/" {
        query_param(&request.query, "prefix")
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into())
    } else {
        request.path.clone()
    };
    match auth.check(bearer(request.header("authorization")), permission, &name) {
        Ok(()) => Ok(()),
        Err(Denied::Unauthenticated) => Err(ApiError {
            extra: vec![("www-authenticate", "Bearer".into())],
            ..ApiError::new(401, "unauthorized", "a valid bearer token is required")
        }),
        Err(Denied::Forbidden) => Err(ApiError::new(
            403,
            "forbidden",
            "this token may not do that on this stream",
        )),
    }
}

pub(super) async fn route(
    core: &Rc<CoreHandle>,
    settings: &PicoSettings,
    request: &Request,
) -> Result<Response, ApiError> {
    let path = request.path.as_str();
    if path.len() > limits::STREAM_NAME_LEN_MAX {
        return Err(ApiError::bad_request(format!(
            "stream name longer than {} bytes",
            limits::STREAM_NAME_LEN_MAX
        )));
    }
    let root = path == "/";
    match request.method.as_str() {
        "OPTIONS" => Ok(Response::new(204)
            .header("access-control-allow-methods", ALLOW_METHODS)
            .header("access-control-allow-headers", ALLOW_HEADERS)
            .header("access-control-max-age", "86400")
            .header("cache-control", "no-store")),
        "GET" if root => Box::pin(list(core, request)).await,
        "PUT" if root => Err(ApiError::bad_request("cannot create the root stream")),
        "POST" if root => Err(ApiError::bad_request("no stream in path")),
        "HEAD" | "DELETE" | "PATCH" if root => Err(ApiError {
            extra: vec![("allow", ROOT_ALLOW_METHODS.into())],
            ..ApiError::new(405, "method_not_allowed", "method not allowed on /")
        }),
        // Only reads wait (long-polls, SSE: thousands at once), so only a read's future is
        // inline; the others are on the heap while they run, not sizing every read's.
        "PUT" => Box::pin(create(core, settings, request)).await,
        "POST" => Box::pin(append(core, request)).await,
        "GET" => read(core, settings, request).await,
        "HEAD" => Box::pin(head(core, request)).await,
        "DELETE" => Box::pin(delete(core, request)).await,
        "PATCH" => Box::pin(configure(core, request)).await,
        // RFC 9110: a 405 lists the methods the resource supports.
        _ => Err(ApiError {
            extra: vec![(
                "allow",
                if root {
                    ROOT_ALLOW_METHODS
                } else {
                    ALLOW_METHODS
                }
                .into(),
            )],
            ..ApiError::new(405, "method_not_allowed", "method not allowed")
        }),
    }
}
