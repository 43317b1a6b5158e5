//! The control API under `{root}__ds/`: the JWKS, creating, describing and deleting
//! subscriptions, linking streams, and the webhook callback, ack, claim and release calls.
//! Each request changes the registry, then waits until the state file has the change.
//!
//! A request names a subscription by its root and id (`registry::key`): one created under
//! another root is not found (`404`, the same answer as an id nobody uses, so ids cannot be
//! probed across roots).

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pico_engine::CoreHandle;
use serde_json::Value;

use super::percent::decode_component;
use super::registry::{
    parse_ack_request, parse_config, parse_streams, AckRequest, ApiError, Clock, Kind, LinkKind,
};
use super::{engine_error, stream_tail, tail_of, StreamTail, Subscriptions};
use super::{glob, registry, webhook_url};
use crate::limits::{
    CREATE_SCAN_STREAMS_MAX, STREAMS_PER_SUBSCRIPTION_MAX, SUBSCRIPTION_ID_BYTES_MAX,
    WORKER_NAME_BYTES_MAX,
};
use crate::transport::message::{Request, Response};

/// Streams asked of the engine per listing page while a pattern subscription links the
/// existing matches.
const LIST_PAGE: usize = 1000;

fn json_response(status: u16, body: &Value) -> Response {
    Response::new(status)
        .header("content-type", "application/json")
        .with_body(body.to_string())
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.status, &e.to_json())
}

fn method_not_allowed(allow: &'static str) -> Response {
    Response::new(405)
        .header("allow", allow)
        .header("content-type", "text/plain")
        .with_body("Method not allowed")
}

fn json_body(request: &Request) -> Result<Value, ApiError> {
    crate::params::control_json(&request.body)
        .map_err(|(status, code, message)| ApiError::new(status, code, message))
}

fn bearer(request: &Request) -> Result<&str, ApiError> {
    crate::params::bearer_text(request).ok_or_else(|| {
        ApiError::new(
            401,
            "TOKEN_INVALID",
            "Missing or malformed Authorization header",
        )
    })
}

fn subscription_id(raw: &str) -> Result<String, ApiError> {
    let id = decode_component(raw)
        .ok_or_else(|| ApiError::invalid("malformed percent-encoding in the subscription id"))?;
    if id.is_empty()
        || id.len() > SUBSCRIPTION_ID_BYTES_MAX
        || id.contains('/')
        || id.chars().any(char::is_control)
    {
        return Err(ApiError::invalid(format!(
            "subscription ids are 1 to {SUBSCRIPTION_ID_BYTES_MAX} bytes without '/' or control characters"
        )));
    }
    Ok(id)
}

impl Subscriptions {
    /// Answers a request whose path is `{root}__ds/{rest}`; `root` ends with '/'.
    /// `base_url` is e.g. "http://127.0.0.1:4437" (scheme + Host header), for absolute URLs in
    /// bodies. `scope` is what a subscription this request creates counts against (see
    /// `Registry::create`).
    pub async fn handle(
        self: &Arc<Self>,
        core: &Rc<CoreHandle>,
        base_url: &str,
        root: &str,
        scope: &str,
        rest: &str,
        request: &Request,
    ) -> Response {
        match self.route(core, base_url, root, scope, rest, request).await {
            Ok(response) => response,
            Err(e) => error_response(&e),
        }
    }

    async fn route(
        self: &Arc<Self>,
        core: &Rc<CoreHandle>,
        base_url: &str,
        root: &str,
        scope: &str,
        rest: &str,
        request: &Request,
    ) -> Result<Response, ApiError> {
        let method = request.method.as_str();
        if rest == "jwks.json" {
            if method != "GET" && method != "HEAD" {
                return Ok(method_not_allowed("GET, HEAD"));
            }
            return Ok(Response::new(200)
                .header("content-type", "application/jwk-set+json")
                .header("cache-control", "public, max-age=300")
                .with_body(self.shared.signing.jwks_json().to_string()));
        }
        let not_found =
            || ApiError::new(404, "NOT_FOUND", "Durable Streams control route not found");
        let route = rest.strip_prefix("subscriptions/").ok_or_else(not_found)?;
        let (raw_id, action) = route.split_once('/').unwrap_or((route, ""));
        let id = subscription_id(raw_id)?;
        // Everything below names the subscription by its key: this root's only.
        let key = registry::key(root, &id);
        match action {
            "" => match method {
                "PUT" => self.create(core, base_url, root, scope, &id, request).await,
                "GET" => self.describe(base_url, root, &key),
                "DELETE" => {
                    {
                        let mut registry = self.shared.write();
                        if registry.delete(&key) {
                            self.shared.active.store(registry.len(), Ordering::SeqCst);
                        }
                    }
                    self.persist().await?;
                    Ok(Response::new(204))
                }
                _ => Ok(method_not_allowed("GET, PUT, DELETE")),
            },
            "streams" if method == "POST" => self.add_streams(core, &key, request).await,
            "streams" => Ok(method_not_allowed("POST")),
            _ if action.starts_with("streams/") => {
                if method != "DELETE" {
                    return Ok(method_not_allowed("DELETE"));
                }
                // Either one encoded segment or several plain ones name the stream.
                let raw = &action["streams/".len()..];
                let path = decode_component(raw)
                    .ok_or_else(|| ApiError::invalid("malformed percent-encoding in the path"))
                    .and_then(|p| registry::normalize_path(&p))?;
                self.shared.write().remove_explicit(&key, &path)?;
                self.persist().await?;
                Ok(Response::new(204))
            }
            "callback" | "ack" | "release" | "claim" if method != "POST" => {
                Ok(method_not_allowed("POST"))
            }
            "callback" => self.settle(core, root, &key, Kind::Webhook, request).await,
            "ack" => self.settle(core, root, &key, Kind::PullWake, request).await,
            "release" => {
                let token = bearer(request)?;
                let ack = parse_ack_request(&json_body(request)?)?;
                let mut effects = Vec::new();
                let result =
                    self.shared
                        .write()
                        .release(&key, token, &ack, Clock::now(), &mut effects);
                self.run_effects(core, effects);
                result.map(|()| Response::new(204))
            }
            "claim" => {
                let body = json_body(request)?;
                let worker = body["worker"]
                    .as_str()
                    .filter(|w| !w.is_empty() && w.len() <= WORKER_NAME_BYTES_MAX)
                    .ok_or_else(|| {
                        ApiError::invalid(format!(
                            "worker must be a non-empty string of at most {WORKER_NAME_BYTES_MAX} bytes"
                        ))
                    })?;
                let mut effects = Vec::new();
                let result = self
                    .shared
                    .write()
                    .claim(&key, worker, Clock::now(), &mut effects);
                self.run_effects(core, effects);
                result.map(|body| json_response(200, &body))
            }
            _ => Err(not_found()),
        }
    }

    fn describe(&self, base_url: &str, root: &str, key: &str) -> Result<Response, ApiError> {
        let jwks_url = format!("{base_url}{root}__ds/jwks.json");
        let body = self
            .shared
            .read()
            .describe(key, self.shared.signing.kid(), &jwks_url)
            .ok_or_else(ApiError::not_found)?;
        Ok(json_response(200, &body))
    }

    async fn create(
        self: &Arc<Self>,
        core: &Rc<CoreHandle>,
        base_url: &str,
        root: &str,
        scope: &str,
        id: &str,
        request: &Request,
    ) -> Result<Response, ApiError> {
        let key = registry::key(root, id);
        let config = parse_config(&json_body(request)?)?;
        if let Some(url) = &config.webhook_url {
            webhook_url::check(url, self.shared.webhook_loopback_allowed())
                .map_err(|e| ApiError::new(400, "WEBHOOK_URL_REJECTED", e.to_string()))?;
        }
        // A re-confirmation needs no engine calls.
        let known = self.shared.read().config(&key).cloned();
        if known.is_none() {
            let links = self.initial_links(core, root, &config).await?;
            let created = {
                let mut registry = self.shared.write();
                let created = registry.create(
                    id,
                    root,
                    scope,
                    &format!("{base_url}{root}"),
                    config,
                    links,
                    Clock::now(),
                )?;
                self.shared.active.store(registry.len(), Ordering::SeqCst);
                created
            };
            self.ensure_sweeper(core);
            self.persist().await?;
            let response = self.describe(base_url, root, &key)?;
            return Ok(Response {
                status: if created { 201 } else { 200 },
                ..response
            });
        }
        if known.as_ref() != Some(&config) {
            return Err(ApiError::new(
                409,
                "SUBSCRIPTION_ALREADY_EXISTS",
                "Subscription already exists with different configuration",
            ));
        }
        // A re-confirmation after a failed write retries it.
        self.persist().await?;
        self.describe(base_url, root, &key)
    }

    /// The streams a new subscription starts with, each at its current tail: the explicit ones
    /// and the existing streams its pattern matches.
    async fn initial_links(
        &self,
        core: &CoreHandle,
        root: &str,
        config: &registry::Config,
    ) -> Result<Vec<(String, LinkKind, StreamTail)>, ApiError> {
        let mut links = Vec::new();
        for path in &config.streams {
            let tail = tail_of(core, &format!("{root}{path}")).await?;
            links.push((path.clone(), LinkKind::Explicit, tail));
        }
        let Some(pattern) = &config.pattern else {
            return Ok(links);
        };
        let prefix = format!("{root}{}", glob::literal_prefix(pattern));
        let mut after = String::new();
        let mut scanned = 0;
        loop {
            let (page, more) = core
                .list(&prefix, &after, LIST_PAGE)
                .await
                .map_err(|e| engine_error(&e))?;
            scanned += page.len();
            for stream in &page {
                let Some(rel) = stream.name.strip_prefix(root) else {
                    continue;
                };
                if rel.starts_with("__ds/")
                    || config.wake_stream.as_deref() == Some(rel)
                    || !glob::matches(pattern, rel)
                {
                    continue;
                }
                links.push((
                    rel.to_string(),
                    LinkKind::Glob,
                    stream_tail(stream.info.next_offset, stream.info.id),
                ));
                if links.len() > STREAMS_PER_SUBSCRIPTION_MAX {
                    return Err(ApiError::new(
                        400,
                        "LIMIT_EXCEEDED",
                        format!(
                            "the pattern matches more than {STREAMS_PER_SUBSCRIPTION_MAX} streams"
                        ),
                    ));
                }
            }
            match page.last() {
                Some(last) if more && scanned < CREATE_SCAN_STREAMS_MAX => {
                    after = last.name.clone()
                }
                _ => {
                    if more {
                        // Streams past the scan are linked by their next write, as new ones.
                        log::warn!(
                            "subscription pattern {pattern}: stopped linking existing streams after {CREATE_SCAN_STREAMS_MAX}"
                        );
                    }
                    return Ok(links);
                }
            }
        }
    }

    async fn add_streams(
        &self,
        core: &CoreHandle,
        key: &str,
        request: &Request,
    ) -> Result<Response, ApiError> {
        let body = json_body(request)?;
        let streams = parse_streams(&body["streams"])?;
        if streams.is_empty() {
            return Err(ApiError::invalid(
                "streams must be a non-empty string array",
            ));
        }
        let root = self
            .shared
            .read()
            .root(key)
            .map(str::to_string)
            .ok_or_else(ApiError::not_found)?;
        let mut links = Vec::with_capacity(streams.len());
        for path in streams {
            let tail = tail_of(core, &format!("{root}{path}")).await?;
            links.push((path, tail));
        }
        self.shared.write().add_explicit(key, links)?;
        self.persist().await?;
        Ok(Response::new(204))
    }

    async fn settle(
        self: &Arc<Self>,
        core: &Rc<CoreHandle>,
        root: &str,
        key: &str,
        kind: Kind,
        request: &Request,
    ) -> Result<Response, ApiError> {
        let token = bearer(request)?;
        let ack: AckRequest = parse_ack_request(&json_body(request)?)?;
        if self.shared.read().config(key).is_none() {
            return Err(ApiError::not_found());
        }
        let mut fresh = Vec::with_capacity(ack.acks.len());
        for (path, _) in &ack.acks {
            fresh.push((path.clone(), tail_of(core, &format!("{root}{path}")).await?));
        }
        let mut effects = Vec::new();
        let result = {
            let mut registry = self.shared.write();
            registry.refresh_tails(key, &fresh);
            registry.settle(key, kind, token, &ack, Clock::now(), &mut effects)
        };
        self.run_effects(core, effects);
        let next_wake = result?;
        self.persist().await?;
        Ok(json_response(
            200,
            &serde_json::json!({"ok": true, "next_wake": next_wake}),
        ))
    }
}
