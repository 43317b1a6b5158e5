//! Sending one call to the bucket: the HTTP client, SigV4 signing per attempt, the attempt
//! timeout, retries of transient failures with full-jitter backoff within the call's deadline,
//! and final failures explained (which secret to check, which region to set).

use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;

use reqwest::{Method, StatusCode};

use super::call::{transient, Answer, AnswerLimit, Call};
use super::config::{S3Config, S3Options};
use crate::limits::S3_POOL_IDLE_TIMEOUT_SECS;
use crate::sigv4;
use crate::StoreError;

pub(crate) struct S3Bucket {
    pub(super) config: S3Config,
    pub(super) options: S3Options,
    pub(super) client: reqwest::Client,
}

impl S3Bucket {
    pub(crate) fn new(config: S3Config, options: S3Options) -> Result<S3Bucket, StoreError> {
        // reqwest is built without a rustls provider; the workspace uses ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(S3_POOL_IDLE_TIMEOUT_SECS))
            .tcp_nodelay(true)
            .user_agent(concat!("picomq/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| StoreError::Io(format!("build the HTTP client: {error}")))?;
        log::info!(
            "object store: {} ({} URLs)",
            config.describe(),
            if config.path_style {
                "path-style"
            } else {
                "virtual-host"
            }
        );
        Ok(S3Bucket {
            config,
            options,
            client,
        })
    }
}

/// A successful answer cut at its limit, except an object's bytes past what the call reads
/// (a prefix, or the whole object a store that ignores ranges sends), which are meant to be
/// cut (an error answer's body is only a message).
fn overlong(limit: AnswerLimit, answer: &Answer) -> bool {
    let cut_on_purpose = match limit {
        AnswerLimit::Bytes(_) => false,
        AnswerLimit::Prefix(_) => true,
        AnswerLimit::Range { .. } => answer.status == StatusCode::OK,
    };
    answer.truncated && answer.status.is_success() && !cut_on_purpose
}

/// Reads `response`'s body up to `bytes_max` bytes; `true` when it went on past them (the
/// rest is left unread and the connection dropped). A body whose `Content-Length` fits is read
/// whole (hyper refuses one longer than it says).
async fn read_body(
    mut response: reqwest::Response,
    bytes_max: usize,
) -> Result<(bytes::Bytes, bool), String> {
    let declared = response
        .content_length()
        .and_then(|length| usize::try_from(length).ok());
    if declared.is_some_and(|length| length <= bytes_max) {
        let body = response.bytes().await.map_err(describe_transport)?;
        return Ok((body, false));
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0).min(bytes_max).min(1 << 20));
    while let Some(chunk) = response.chunk().await.map_err(describe_transport)? {
        let room = bytes_max - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body.into(), true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.into(), false))
}

impl S3Bucket {
    /// Sends `call` until it gets a non-transient answer, retrying transient failures with
    /// backoff. `Ok` carries any final answer, success or not; `Err` means retries ran out.
    pub(super) async fn execute(&self, what: &str, call: &Call) -> Result<Answer, StoreError> {
        let started = Instant::now();
        let deadline = started + self.options.deadline;
        let max_attempts = self.options.max_attempts.max(1);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = self.options.attempt_timeout.min(remaining);
            let mut asked_wait = Duration::ZERO;
            let reason = match self.attempt(call, timeout).await {
                Ok(answer) if overlong(call.answer_limit, &answer) => {
                    return Err(StoreError::Io(format!(
                        "{what} at {}: the store's answer (HTTP {}) is longer than the {} bytes \
                         it may be",
                        self.config.describe(),
                        answer.status,
                        call.answer_limit.bytes_max(answer.status)
                    )));
                }
                Ok(answer) => match transient(&answer, call.error_in_ok_body) {
                    None => return Ok(answer),
                    Some(reason) => {
                        // A server that says when to come back (429/503 `Retry-After: secs`)
                        // is believed, up to the backoff cap.
                        asked_wait = answer
                            .header("retry-after")
                            .and_then(|secs| secs.trim().parse::<u64>().ok())
                            .map(|secs| Duration::from_secs(secs).min(self.options.max_backoff))
                            .unwrap_or_default();
                        reason
                    }
                },
                Err(reason) => reason,
            };
            let backoff = self.backoff(attempt).max(asked_wait);
            let elapsed = started.elapsed();
            if attempt >= max_attempts || elapsed + backoff >= self.options.deadline {
                return Err(StoreError::Io(format!(
                    "{what} at {}: gave up after {attempt} attempt{} in {:.1} s: {reason}",
                    self.config.describe(),
                    if attempt == 1 { "" } else { "s" },
                    elapsed.as_secs_f64()
                )));
            }
            log::warn!(
                "{what}: {reason}; retry {attempt}/{} in {} ms",
                max_attempts - 1,
                backoff.as_millis()
            );
            tokio::time::sleep(backoff).await;
        }
    }

    /// Full jitter: uniform in `[0, min(max_backoff, base_backoff * 2^(attempt-1))]`.
    pub(super) fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self
            .options
            .base_backoff
            .saturating_mul(1u32 << (attempt - 1).min(20))
            .min(self.options.max_backoff);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(..=nanos))
    }

    /// One signed request. `Err` is a transport failure (always transient), described.
    async fn attempt(&self, call: &Call, timeout: Duration) -> Result<Answer, String> {
        if timeout.is_zero() {
            return Err("the call's deadline passed".to_string());
        }
        let query = sigv4::canonical_query(&call.query);
        let url = self
            .config
            .url(call.key.as_deref(), &query)
            .map_err(|error| error.to_string())?;
        let host = match url.port() {
            Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
            None => url.host_str().unwrap_or_default().to_string(),
        };
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|since| since.as_secs())
            .unwrap_or(0);
        let amz_date = sigv4::amz_date(now);
        let mut headers = vec![
            ("host".to_string(), host),
            (
                "x-amz-content-sha256".to_string(),
                call.payload_hash.clone(),
            ),
            ("x-amz-date".to_string(), amz_date.clone()),
        ];
        if let Some(token) = &self.config.credentials.session_token {
            headers.push(("x-amz-security-token".to_string(), token.clone()));
        }
        headers.extend(call.headers.iter().cloned());
        let scope = sigv4::Scope {
            amz_date: &amz_date,
            region: &self.config.region,
            service: "s3",
        };
        let request = sigv4::SigningRequest {
            method: call.method.as_str(),
            path: url.path(),
            query: &call.query,
            headers: &headers,
            payload_hash: &call.payload_hash,
        };
        let authorization = sigv4::authorization(&self.config.credentials, &scope, &request);
        let mut builder = self
            .client
            .request(call.method.clone(), url)
            .timeout(timeout)
            .header("authorization", authorization);
        // `host` is set by the HTTP client from the URL, to the value signed above.
        for (name, value) in headers.iter().filter(|(name, _)| name != "host") {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if matches!(call.method, Method::PUT | Method::POST) {
            if call.body.is_empty() {
                // Some stores refuse a body-less PUT without an explicit length.
                builder = builder.header("content-length", "0");
            }
            builder = builder.body(call.body.clone());
        }
        let response = builder.send().await.map_err(describe_transport)?;
        let status = response.status();
        let headers = response.headers().clone();
        let (body, truncated) = read_body(response, call.answer_limit.bytes_max(status)).await?;
        Ok(Answer {
            status,
            headers,
            body,
            truncated,
        })
    }

    /// A final, non-success answer as an error that names the cause and the fix.
    pub(super) fn failure(&self, what: &str, answer: &Answer) -> StoreError {
        let (code, message) = answer.error();
        let detail = match (code.is_empty(), message.is_empty()) {
            (true, true) => format!("HTTP {}", answer.status),
            (false, true) => format!("HTTP {} {code}", answer.status),
            (_, false) => format!("HTTP {} {code}: {message}", answer.status),
        };
        let access_key = &self.config.credentials.access_key_id;
        let bucket = self.config.describe();
        let explained = match (answer.status.as_u16(), code.as_str()) {
            (403, "InvalidAccessKeyId") => format!(
                "access denied: check AWS_ACCESS_KEY_ID (the store does not know access key \
                 {access_key}) [{detail}]"
            ),
            (403, "RequestTimeTooSkewed") => {
                format!("access denied: the system clock is off by more than 15 minutes [{detail}]")
            }
            (403, _) => format!(
                "access denied: check AWS_SECRET_ACCESS_KEY (it must be the secret of access \
                 key {access_key}) and that this key may use the bucket [{detail}]"
            ),
            (404, "NoSuchBucket") => format!("{bucket} does not exist [{detail}]"),
            (301 | 307 | 400, "PermanentRedirect" | "AuthorizationHeaderMalformed") => {
                let region = answer
                    .header("x-amz-bucket-region")
                    .map(|region| format!(" (the store says region={region})"))
                    .unwrap_or_default();
                format!("wrong region for {bucket}: set region=… in the URI{region} [{detail}]")
            }
            _ => detail,
        };
        StoreError::Io(format!("{what}: {explained}"))
    }
}

/// A transport error with its causes ("connection refused", "operation timed out"), which
/// reqwest's own `Display` leaves out.
fn describe_transport(error: reqwest::Error) -> String {
    let mut text = if error.is_timeout() {
        "timed out".to_string()
    } else if error.is_connect() {
        "cannot connect".to_string()
    } else {
        "transport error".to_string()
    };
    let mut source: Option<&dyn std::error::Error> = Some(&error);
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}
