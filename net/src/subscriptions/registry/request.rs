//! What a subscription request says, parsed and checked: a subscription's configuration (its
//! kind, streams and patterns, lease, webhook), an ack request, and the error answers of the
//! subscription routes.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::super::glob;
use super::super::keys::TokenError;
use crate::limits::{
    ACKS_PER_REQUEST_MAX, LEASE_TTL_MS_DEFAULT, LEASE_TTL_MS_MAX, LEASE_TTL_MS_MIN,
    STREAMS_PER_SUBSCRIPTION_MAX, SUBSCRIPTION_DESCRIPTION_BYTES_MAX, SUBSCRIPTION_PATH_BYTES_MAX,
};

/// An error answer: `{"error":{"code":…,"message":…}}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// `ALREADY_CLAIMED` names the holder and the wake's generation.
    pub holder: Option<(String, u64)>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            holder: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "INVALID_REQUEST", message)
    }

    pub fn not_found() -> ApiError {
        ApiError::new(404, "SUBSCRIPTION_NOT_FOUND", "Subscription not found")
    }

    pub(super) fn fenced() -> ApiError {
        ApiError::new(409, "FENCED", "Wake generation is stale")
    }

    pub(super) fn offset(message: &str) -> ApiError {
        ApiError::new(409, "INVALID_OFFSET", message)
    }

    pub fn to_json(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some((holder, generation)) = &self.holder {
            error["current_holder"] = json!(holder);
            error["generation"] = json!(generation);
        }
        json!({ "error": error })
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> ApiError {
        match e {
            TokenError::Invalid => ApiError::new(401, "TOKEN_INVALID", "Token invalid"),
            TokenError::Expired => ApiError::new(401, "TOKEN_EXPIRED", "Token expired"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Webhook,
    PullWake,
}

impl Kind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::PullWake => "pull-wake",
        }
    }
}

/// What a `PUT` configures; an identical `PUT` re-confirms (`200`), a different one conflicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub kind: Kind,
    pub pattern: Option<String>,
    pub streams: BTreeSet<String>,
    pub webhook_url: Option<String>,
    pub wake_stream: Option<String>,
    pub lease_ttl_ms: u64,
    pub description: Option<String>,
}

fn optional_str<'a>(body: &'a Value, field: &str) -> Result<Option<&'a str>, ApiError> {
    match &body[field] {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s)),
        _ => Err(ApiError::invalid(format!("{field} must be a string"))),
    }
}

/// Strips leading and trailing slashes and checks a stream path relative to the root.
pub fn normalize_path(raw: &str) -> Result<String, ApiError> {
    let path = raw.trim_matches('/');
    if path.is_empty() || path.len() > SUBSCRIPTION_PATH_BYTES_MAX {
        return Err(ApiError::invalid(format!(
            "stream paths must be 1 to {SUBSCRIPTION_PATH_BYTES_MAX} bytes"
        )));
    }
    if path.chars().any(char::is_control)
        || path
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(ApiError::invalid(format!("invalid stream path {raw:?}")));
    }
    if path == "__ds" || path.starts_with("__ds/") {
        return Err(ApiError::invalid("__ds is reserved"));
    }
    Ok(path.to_string())
}

/// Parses a `streams` array of relative paths.
pub fn parse_streams(value: &Value) -> Result<BTreeSet<String>, ApiError> {
    let items = match value {
        Value::Null => return Ok(BTreeSet::new()),
        Value::Array(items) => items,
        _ => return Err(ApiError::invalid("streams must be an array of strings")),
    };
    if items.len() > STREAMS_PER_SUBSCRIPTION_MAX {
        return Err(limit_streams());
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => normalize_path(s),
            _ => Err(ApiError::invalid("streams must be an array of strings")),
        })
        .collect()
}

pub(super) fn limit_streams() -> ApiError {
    ApiError::new(
        400,
        "LIMIT_EXCEEDED",
        format!("a subscription links at most {STREAMS_PER_SUBSCRIPTION_MAX} streams"),
    )
}

/// Parses the body of `PUT …/subscriptions/:id` (webhook URL safety is checked separately).
pub fn parse_config(body: &Value) -> Result<Config, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid("Request body must be a JSON object"));
    }
    let kind = match body["type"].as_str() {
        Some("webhook") => Kind::Webhook,
        Some("pull-wake") => Kind::PullWake,
        _ => {
            return Err(ApiError::invalid(
                r#"type must be "webhook" or "pull-wake""#,
            ))
        }
    };
    let pattern = match optional_str(body, "pattern")? {
        None => None,
        Some(raw) => {
            let pattern = raw.trim_matches('/').to_string();
            if pattern.len() > SUBSCRIPTION_PATH_BYTES_MAX {
                return Err(ApiError::invalid(format!(
                    "pattern is longer than {SUBSCRIPTION_PATH_BYTES_MAX} bytes"
                )));
            }
            glob::validate(&pattern).map_err(|e| ApiError::invalid(e.to_string()))?;
            Some(pattern)
        }
    };
    let streams = parse_streams(&body["streams"])?;
    if pattern.is_none() && streams.is_empty() {
        return Err(ApiError::invalid(
            "At least one of pattern or streams is required",
        ));
    }
    let lease_ttl_ms = match &body["lease_ttl_ms"] {
        Value::Null => LEASE_TTL_MS_DEFAULT,
        v => v
            .as_u64()
            .filter(|ms| (LEASE_TTL_MS_MIN..=LEASE_TTL_MS_MAX).contains(ms))
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "lease_ttl_ms must be an integer from {LEASE_TTL_MS_MIN} to {LEASE_TTL_MS_MAX}"
                ))
            })?,
    };
    let webhook_url = match kind {
        Kind::Webhook => Some(
            body["webhook"]["url"]
                .as_str()
                .filter(|u| !u.is_empty())
                .ok_or_else(|| ApiError::invalid("webhook subscriptions require webhook.url"))?
                .to_string(),
        ),
        Kind::PullWake => None,
    };
    let wake_stream = match kind {
        Kind::PullWake => Some(normalize_path(
            optional_str(body, "wake_stream")?
                .ok_or_else(|| ApiError::invalid("pull-wake subscriptions require wake_stream"))?,
        )?),
        Kind::Webhook => None,
    };
    let description = optional_str(body, "description")?.map(str::to_string);
    if description
        .as_ref()
        .is_some_and(|d| d.len() > SUBSCRIPTION_DESCRIPTION_BYTES_MAX)
    {
        return Err(ApiError::invalid(format!(
            "description is longer than {SUBSCRIPTION_DESCRIPTION_BYTES_MAX} bytes"
        )));
    }
    Ok(Config {
        kind,
        pattern,
        streams,
        webhook_url,
        wake_stream,
        lease_ttl_ms,
        description,
    })
}

/// The body of a webhook callback, a pull-wake ack or a release.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AckRequest {
    pub wake_id: Option<String>,
    pub generation: Option<u64>,
    /// (relative stream path, offset)
    pub acks: Vec<(String, String)>,
    pub done: bool,
}

pub fn parse_ack_request(body: &Value) -> Result<AckRequest, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid("Request body must be a JSON object"));
    }
    let acks = match &body["acks"] {
        Value::Null => Vec::new(),
        Value::Array(items) if items.len() <= ACKS_PER_REQUEST_MAX => items
            .iter()
            .map(|ack| {
                let stream = ack["stream"]
                    .as_str()
                    .or_else(|| ack["path"].as_str())
                    .ok_or_else(|| ApiError::invalid("each ack needs stream and offset"))?;
                let offset = ack["offset"]
                    .as_str()
                    .ok_or_else(|| ApiError::invalid("each ack needs stream and offset"))?;
                Ok((normalize_path(stream)?, offset.to_string()))
            })
            .collect::<Result<_, ApiError>>()?,
        Value::Array(_) => {
            return Err(ApiError::invalid(format!(
                "at most {ACKS_PER_REQUEST_MAX} acks per request"
            )))
        }
        _ => return Err(ApiError::invalid("acks must be an array")),
    };
    Ok(AckRequest {
        wake_id: body["wake_id"].as_str().map(str::to_string),
        generation: body["generation"].as_u64(),
        acks,
        done: body["done"] == Value::Bool(true),
    })
}

/// `<digits>_<digits>`: the only offsets an ack may name.
pub(super) fn is_offset(text: &str) -> bool {
    text.len() <= 64
        && text.split_once('_').is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        })
}
