//! The `s3://` backend: S3 REST calls signed with SigV4 (`sigv4.rs`), sent with reqwest on the
//! upload thread's tokio runtime.
//!
//! Every call retries transient failures (connection errors, timeouts, 5xx, 429, 503 SlowDown)
//! with exponential backoff and full jitter, within a bounded number of attempts and a total
//! deadline. Permanent answers (403, 404, other 4xx) are never retried. Retrying a put is safe:
//! keys are written once with fixed contents (same key, same bytes), and a PUT replaces the
//! whole object atomically, so a retried PUT cannot duplicate or tear data.

use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::Method;
use reqwest::StatusCode;
use reqwest::Url;

use crate::backend::check_range;
use crate::sigv4;
use crate::sigv4::S3Credentials;
use crate::xml;
use crate::StoreError;

/// S3's smallest part (every part but the last).
const MIN_PART_SIZE: usize = 5 << 20;
/// S3's largest part count.
const MAX_PARTS: usize = 10_000;
/// Parts of one multipart put in flight at once.
const PART_CONCURRENCY: usize = 4;
/// Bodies at least this big are hashed on the blocking pool, not on the runtime thread.
const HASH_OFF_THREAD: usize = 256 << 10;

/// Tuning of the `s3://` backend (part of [`crate::ObjectStoreOptions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Options {
    /// Objects larger than this are stored with a multipart upload.
    pub multipart_threshold: usize,
    /// Part size of multipart uploads (at least 5 MiB; grown if an object would need more than
    /// 10 000 parts).
    pub part_size: usize,
    /// `max-keys` of each ListObjectsV2 page (1..=1000).
    pub list_page_size: u32,
    /// Most attempts per call (first try included).
    pub max_attempts: u32,
    /// Total time one call may spend, retries and backoff included.
    pub deadline: Duration,
    /// Time limit of one attempt (connect, send, whole answer).
    pub attempt_timeout: Duration,
    /// Time limit of a TCP (and TLS) connect.
    pub connect_timeout: Duration,
    /// First backoff ceiling; doubles per retry up to `max_backoff` (full jitter below it).
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    /// Check the bucket and the credentials at open (ListObjectsV2, max-keys=1), so a wrong
    /// secret or a missing bucket fails at startup.
    pub probe_at_open: bool,
    /// `None`: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` from the
    /// environment.
    pub credentials: Option<S3Credentials>,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            multipart_threshold: 16 << 20,
            part_size: 8 << 20,
            list_page_size: 1000,
            max_attempts: 8,
            deadline: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            base_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            probe_at_open: true,
            credentials: None,
        }
    }
}

/// Where the bucket is and how to sign for it, from the URI and the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct S3Config {
    pub bucket: String,
    pub region: String,
    /// `scheme://host[:port]`, no path.
    pub endpoint: Url,
    pub path_style: bool,
    pub credentials: S3Credentials,
}

impl S3Config {
    /// `lookup` reads an environment variable (a seam for tests).
    pub(crate) fn new(
        bucket: &str,
        params: &[(String, String)],
        credentials: Option<S3Credentials>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<S3Config, StoreError> {
        let bad = |why: String| StoreError::BadUri(format!("s3://{bucket}: {why}"));
        let mut region = None;
        let mut endpoint = None;
        let mut path_style = false;
        for (name, value) in params {
            match name.as_str() {
                "region" => region = Some(value.clone()).filter(|value| !value.is_empty()),
                "endpoint" => endpoint = Some(value.clone()).filter(|value| !value.is_empty()),
                "pathStyle" => {
                    path_style = match value.as_str() {
                        "true" | "" => true,
                        "false" => false,
                        other => {
                            return Err(bad(format!(
                                "pathStyle must be true or false, not \"{other}\""
                            )))
                        }
                    }
                }
                other => log::warn!(
                    "s3://{bucket}: parameter \"{other}\" is not understood and has no effect \
                     (known: region, endpoint, pathStyle)"
                ),
            }
        }
        let present = |name: &str| lookup(name).filter(|value| !value.is_empty());
        let region = region
            .or_else(|| present("AWS_REGION"))
            .or_else(|| present("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".to_string());
        let endpoint_text =
            endpoint.unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let endpoint = Url::parse(&endpoint_text)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && url.host_str().is_some())
            .ok_or_else(|| {
                bad(format!(
                    "endpoint \"{endpoint_text}\" is not an http:// or https:// URL \
                     (e.g. endpoint=http://127.0.0.1:3900)"
                ))
            })?;
        if !matches!(endpoint.path(), "" | "/") || endpoint.query().is_some() {
            return Err(bad(format!(
                "endpoint \"{endpoint_text}\" must be scheme://host[:port] without a path"
            )));
        }
        let credentials = match credentials {
            Some(credentials) => credentials,
            None => {
                let access_key_id = present("AWS_ACCESS_KEY_ID");
                let secret_access_key = present("AWS_SECRET_ACCESS_KEY");
                match (access_key_id, secret_access_key) {
                    (Some(access_key_id), Some(secret_access_key)) => S3Credentials {
                        access_key_id,
                        secret_access_key,
                        session_token: present("AWS_SESSION_TOKEN"),
                    },
                    (id, _) => {
                        let missing = if id.is_none() {
                            "AWS_ACCESS_KEY_ID"
                        } else {
                            "AWS_SECRET_ACCESS_KEY"
                        };
                        return Err(bad(format!(
                            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                             (and AWS_SESSION_TOKEN for temporary credentials); {missing} is \
                             not set"
                        )));
                    }
                }
            }
        };
        Ok(S3Config {
            bucket: bucket.to_string(),
            region,
            endpoint,
            path_style,
            credentials,
        })
    }

    /// The URL of an object (`Some(key)`) or of the bucket (`None`), with an already-canonical
    /// query string.
    fn url(&self, key: Option<&str>, query: &str) -> Result<Url, StoreError> {
        let scheme = self.endpoint.scheme();
        let host = self.endpoint.host_str().unwrap_or_default();
        let port = self
            .endpoint
            .port()
            .map(|port| format!(":{port}"))
            .unwrap_or_default();
        let key_path = key.map(|key| sigv4::uri_encode(key, false));
        let (authority, path) = if self.path_style {
            let bucket = sigv4::uri_encode(&self.bucket, true);
            let path = match key_path {
                Some(key) => format!("/{bucket}/{key}"),
                None => format!("/{bucket}"),
            };
            (format!("{host}{port}"), path)
        } else {
            let path = format!("/{}", key_path.unwrap_or_default());
            (format!("{}.{host}{port}", self.bucket), path)
        };
        let separator = if query.is_empty() { "" } else { "?" };
        let text = format!("{scheme}://{authority}{path}{separator}{query}");
        Url::parse(&text)
            .map_err(|error| StoreError::Io(format!("bad request URL {text}: {error}")))
    }

    /// `endpoint/bucket`, for messages.
    fn describe(&self) -> String {
        format!(
            "bucket \"{}\" at {} (region {})",
            self.bucket,
            self.endpoint.as_str().trim_end_matches('/'),
            self.region
        )
    }
}

/// One S3 REST call, re-signed on every attempt.
struct Call {
    method: Method,
    /// `None`: a bucket-level call.
    key: Option<String>,
    query: Vec<(String, String)>,
    /// Extra headers, all signed (e.g. `range`).
    headers: Vec<(String, String)>,
    body: Bytes,
    /// Hex SHA-256 of `body`, or `UNSIGNED-PAYLOAD`.
    payload_hash: String,
    /// CompleteMultipartUpload can fail with a 200 whose body is an `<Error>`.
    error_in_ok_body: bool,
}

impl Call {
    fn new(method: Method, key: Option<&str>) -> Call {
        Call {
            method,
            key: key.map(str::to_string),
            query: Vec::new(),
            headers: Vec::new(),
            body: Bytes::new(),
            payload_hash: sigv4::UNSIGNED_PAYLOAD.to_string(),
            error_in_ok_body: false,
        }
    }

    fn query(mut self, name: &str, value: &str) -> Call {
        self.query.push((name.to_string(), value.to_string()));
        self
    }

    fn header(mut self, name: &str, value: &str) -> Call {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    async fn body(mut self, body: Bytes) -> Call {
        self.payload_hash = hash(body.clone()).await;
        self.body = body;
        self
    }
}

/// SHA-256 of a body; big ones on the blocking pool so the runtime thread keeps serving.
async fn hash(body: Bytes) -> String {
    if body.len() < HASH_OFF_THREAD {
        return sigv4::sha256_hex(&body);
    }
    let hashed = tokio::task::spawn_blocking({
        let body = body.clone();
        move || sigv4::sha256_hex(&body)
    })
    .await;
    hashed.unwrap_or_else(|_| sigv4::sha256_hex(&body))
}

/// A complete answer (the body is read inside the attempt, so a broken body is retried too).
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    /// `(Code, Message)` of an error body.
    fn error(&self) -> (String, String) {
        xml::parse_error(&String::from_utf8_lossy(&self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

pub(crate) struct S3Bucket {
    config: S3Config,
    options: S3Options,
    client: reqwest::Client,
}

impl S3Bucket {
    pub(crate) fn new(config: S3Config, options: S3Options) -> Result<S3Bucket, StoreError> {
        // reqwest is built without a rustls provider; the workspace uses ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(30))
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

    /// Lists at most one key: proves the endpoint answers, the bucket exists and the
    /// credentials are accepted.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        let call = Call::new(Method::GET, None)
            .query("list-type", "2")
            .query("max-keys", "1");
        let what = format!("open {}", self.config.describe());
        let answer = self.execute(&what, &call).await?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(self.failure(&what, &answer))
        }
    }

    pub(crate) async fn put(self: Arc<Self>, key: &str, data: Bytes) -> Result<(), StoreError> {
        if data.len() > self.options.multipart_threshold {
            return self.put_multipart(key, data).await;
        }
        let what = format!("put {key} ({} bytes)", data.len());
        let call = Call::new(Method::PUT, Some(key)).body(data).await;
        let answer = self.execute(&what, &call).await?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(self.failure(&what, &answer))
        }
    }

    async fn put_multipart(self: Arc<Self>, key: &str, data: Bytes) -> Result<(), StoreError> {
        let what = format!("multipart put {key} ({} bytes)", data.len());
        let part_size = self
            .options
            .part_size
            .max(MIN_PART_SIZE)
            .max(data.len().div_ceil(MAX_PARTS));
        let create = Call::new(Method::POST, Some(key)).query("uploads", "");
        let answer = self.execute(&what, &create).await?;
        if !answer.status.is_success() {
            return Err(self.failure(&what, &answer));
        }
        let upload_id = xml::first(&String::from_utf8_lossy(&answer.body), "UploadId")
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                StoreError::Io(format!(
                    "{what}: CreateMultipartUpload answered no UploadId"
                ))
            })?;
        let result = self
            .clone()
            .upload_parts(key, &upload_id, data, part_size, &what)
            .await;
        if result.is_err() {
            // Best effort: a leftover upload costs storage until a lifecycle rule removes it,
            // never correctness (an incomplete upload is not an object).
            let abort = Call::new(Method::DELETE, Some(key)).query("uploadId", &upload_id);
            match self.execute(&format!("abort {what}"), &abort).await {
                Ok(answer) if answer.status.is_success() || answer.status == 404 => {}
                Ok(answer) => log::warn!(
                    "abort {what}: {}",
                    self.failure("AbortMultipartUpload", &answer)
                ),
                Err(error) => log::warn!("abort {what}: {error}"),
            }
        }
        result
    }

    async fn upload_parts(
        self: Arc<Self>,
        key: &str,
        upload_id: &str,
        data: Bytes,
        part_size: usize,
        what: &str,
    ) -> Result<(), StoreError> {
        let count = data.len().div_ceil(part_size);
        let mut etags: Vec<Option<String>> = vec![None; count];
        let mut running = tokio::task::JoinSet::new();
        let mut next = 0;
        while next < count || !running.is_empty() {
            while next < count && running.len() < PART_CONCURRENCY {
                let number = next + 1;
                let part = data.slice(next * part_size..((next + 1) * part_size).min(data.len()));
                let bucket = self.clone();
                let (key, upload_id) = (key.to_string(), upload_id.to_string());
                let what = format!("{what}: part {number}/{count}");
                running.spawn(async move {
                    let call = Call::new(Method::PUT, Some(&key))
                        .query("partNumber", &number.to_string())
                        .query("uploadId", &upload_id)
                        .body(part)
                        .await;
                    let answer = bucket.execute(&what, &call).await?;
                    if !answer.status.is_success() {
                        return Err(bucket.failure(&what, &answer));
                    }
                    let etag = answer.header("etag").map(str::to_string).ok_or_else(|| {
                        StoreError::Io(format!("{what}: UploadPart answered no ETag"))
                    })?;
                    Ok((number, etag))
                });
                next += 1;
            }
            match running.join_next().await {
                Some(Ok(Ok((number, etag)))) => etags[number - 1] = Some(etag),
                Some(Ok(Err(error))) => return Err(error), // dropping the set aborts the rest
                Some(Err(error)) => {
                    return Err(StoreError::Io(format!(
                        "{what}: part upload failed: {error}"
                    )))
                }
                None => {}
            }
        }
        let mut body = String::from(
            "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
        );
        for (index, etag) in etags.iter().enumerate() {
            let etag = etag.as_deref().expect("every part answered");
            body.push_str(&format!(
                "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>",
                index + 1,
                xml::escape(etag)
            ));
        }
        body.push_str("</CompleteMultipartUpload>");
        let mut complete = Call::new(Method::POST, Some(key))
            .query("uploadId", upload_id)
            .body(Bytes::from(body))
            .await;
        complete.error_in_ok_body = true;
        let answer = self.execute(what, &complete).await?;
        if answer.status.is_success() && !is_error_body(&answer.body) {
            Ok(())
        } else {
            Err(self.failure(what, &answer))
        }
    }

    pub(crate) async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let what = format!("get {key}");
        let answer = self
            .execute(&what, &Call::new(Method::GET, Some(key)))
            .await?;
        match answer.status {
            status if status.is_success() => Ok(answer.body),
            StatusCode::NOT_FOUND if answer.error().0 != "NoSuchBucket" => {
                Err(StoreError::NotFound(key.to_string()))
            }
            _ => Err(self.failure(&what, &answer)),
        }
    }

    /// Bytes `start..end`, exactly, or an error: never a short read.
    pub(crate) async fn get_range(
        &self,
        key: &str,
        start: u64,
        end: u64,
    ) -> Result<Bytes, StoreError> {
        if start > end {
            return Err(StoreError::Io(format!(
                "range {start}..{end} of {key} is inverted"
            )));
        }
        if start == end {
            // No HTTP range is empty: check that the object exists and is long enough.
            let size = self.size(key).await?;
            check_range(key, start, end, size)?;
            return Ok(Bytes::new());
        }
        let what = format!("get {key} bytes {start}..{end}");
        let call = Call::new(Method::GET, Some(key))
            .header("range", &format!("bytes={start}-{}", end - 1));
        let answer = self.execute(&what, &call).await?;
        let wanted = (end - start) as usize;
        match answer.status {
            StatusCode::PARTIAL_CONTENT => {
                if answer.body.len() == wanted {
                    return Ok(answer.body);
                }
                // The object ends inside the range: S3 answers what there is.
                let size = answer
                    .header("content-range")
                    .and_then(|range| range.rsplit('/').next())
                    .and_then(|total| total.trim().parse().ok())
                    .unwrap_or(start + answer.body.len() as u64);
                check_range(key, start, end, size)?;
                Err(StoreError::Io(format!(
                    "{what}: the store answered {} bytes",
                    answer.body.len()
                )))
            }
            StatusCode::OK => {
                // The whole object (a store that ignores ranges).
                check_range(key, start, end, answer.body.len() as u64)?;
                Ok(answer.body.slice(start as usize..end as usize))
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                let size = self.size(key).await?;
                check_range(key, start, end, size)?;
                Err(StoreError::Io(format!(
                    "{what}: the store refused the range of a {size}-byte object"
                )))
            }
            StatusCode::NOT_FOUND if answer.error().0 != "NoSuchBucket" => {
                Err(StoreError::NotFound(key.to_string()))
            }
            _ => Err(self.failure(&what, &answer)),
        }
    }

    /// The object's size (HEAD).
    async fn size(&self, key: &str) -> Result<u64, StoreError> {
        let what = format!("head {key}");
        let answer = self
            .execute(&what, &Call::new(Method::HEAD, Some(key)))
            .await?;
        match answer.status {
            status if status.is_success() => answer
                .header("content-length")
                .and_then(|length| length.parse().ok())
                .ok_or_else(|| StoreError::Io(format!("{what}: no Content-Length"))),
            StatusCode::NOT_FOUND => Err(StoreError::NotFound(key.to_string())),
            _ => Err(self.failure(&what, &answer)),
        }
    }

    pub(crate) async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let what = format!("delete {key}");
        let answer = self
            .execute(&what, &Call::new(Method::DELETE, Some(key)))
            .await?;
        match answer.status {
            status if status.is_success() => Ok(()),
            StatusCode::NOT_FOUND if answer.error().0 != "NoSuchBucket" => Ok(()),
            _ => Err(self.failure(&what, &answer)),
        }
    }

    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let what = format!("list \"{prefix}\"");
        let page_size = self.options.list_page_size.clamp(1, 1000).to_string();
        let mut listed = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut call = Call::new(Method::GET, None)
                .query("list-type", "2")
                .query("encoding-type", "url")
                .query("max-keys", &page_size);
            if !prefix.is_empty() {
                call = call.query("prefix", prefix);
            }
            if let Some(token) = &token {
                call = call.query("continuation-token", token);
            }
            let answer = self.execute(&what, &call).await?;
            if !answer.status.is_success() {
                return Err(self.failure(&what, &answer));
            }
            let text = std::str::from_utf8(&answer.body)
                .map_err(|_| StoreError::Io(format!("{what}: the answer is not UTF-8")))?;
            let page = xml::parse_list(text, true)
                .map_err(|why| StoreError::Io(format!("{what}: {why}")))?;
            listed.extend(page.objects);
            match page.next {
                Some(next) if Some(&next) == token.as_ref() => {
                    return Err(StoreError::Io(format!(
                        "{what}: the store repeated continuation token {next:?}"
                    )))
                }
                Some(next) => token = Some(next),
                None => break,
            }
        }
        // S3 lists in UTF-8 byte order already; sorting keeps the contract for any store.
        listed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        listed.dedup_by(|a, b| a.0 == b.0);
        Ok(listed)
    }

    /// Sends `call` until it gets a non-transient answer, retrying transient failures with
    /// backoff. `Ok` carries any final answer, success or not; `Err` means retries ran out.
    async fn execute(&self, what: &str, call: &Call) -> Result<Answer, StoreError> {
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
    fn backoff(&self, attempt: u32) -> Duration {
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
        let body = response.bytes().await.map_err(describe_transport)?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// A final, non-success answer as an error that names the cause and the fix.
    fn failure(&self, what: &str, answer: &Answer) -> StoreError {
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

/// Why an answer is worth retrying, or `None` if it is final.
fn transient(answer: &Answer, error_in_ok_body: bool) -> Option<String> {
    let status = answer.status;
    let retry = status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || (status == StatusCode::BAD_REQUEST && answer.error().0 == "RequestTimeout")
        || (error_in_ok_body && status.is_success() && is_error_body(&answer.body));
    if !retry {
        return None;
    }
    let (code, message) = answer.error();
    Some(format!("HTTP {status} {code} {message}").trim().to_string())
}

/// A 200 answer can still carry an `<Error>` (CompleteMultipartUpload).
fn is_error_body(body: &[u8]) -> bool {
    xml::root_name(&String::from_utf8_lossy(body)).as_deref() == Some("Error")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    fn env(items: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            items
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        }
    }

    const KEYS: &[(&str, &str)] = &[
        ("AWS_ACCESS_KEY_ID", "AK"),
        ("AWS_SECRET_ACCESS_KEY", "SK"),
        ("AWS_REGION", "eu-west-3"),
    ];

    #[test]
    fn config_from_uri_and_environment() {
        let config = S3Config::new(
            "segments",
            &params(&[
                ("region", "garage"),
                ("endpoint", "http://127.0.0.1:3900"),
                ("pathStyle", "true"),
            ]),
            None,
            env(KEYS),
        )
        .unwrap();
        assert_eq!(config.region, "garage");
        assert!(config.path_style);
        assert_eq!(config.credentials.access_key_id, "AK");
        assert_eq!(config.credentials.session_token, None);
        assert_eq!(
            config.url(Some("seg/a b/ü"), "").unwrap().as_str(),
            "http://127.0.0.1:3900/segments/seg/a%20b/%C3%BC"
        );
        assert_eq!(
            config
                .url(None, "list-type=2&prefix=a%2Fb")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:3900/segments?list-type=2&prefix=a%2Fb"
        );

        // Region from the environment, AWS endpoint, virtual-host style.
        let config = S3Config::new("bkt", &[], None, env(KEYS)).unwrap();
        assert_eq!(config.region, "eu-west-3");
        assert!(!config.path_style);
        assert_eq!(
            config.url(Some("k+1"), "").unwrap().as_str(),
            "https://bkt.s3.eu-west-3.amazonaws.com/k%2B1"
        );
        assert_eq!(
            config.url(None, "").unwrap().as_str(),
            "https://bkt.s3.eu-west-3.amazonaws.com/"
        );
        let session: &[(&str, &str)] = &[
            ("AWS_ACCESS_KEY_ID", "AK"),
            ("AWS_SECRET_ACCESS_KEY", "SK"),
            ("AWS_SESSION_TOKEN", "T"),
            ("AWS_DEFAULT_REGION", "ap-south-1"),
        ];
        let config = S3Config::new("b", &[], None, env(session)).unwrap();
        assert_eq!(config.credentials.session_token.as_deref(), Some("T"));
        assert_eq!(config.region, "ap-south-1");
    }

    #[test]
    fn missing_credentials_and_bad_endpoints_are_bad_uris() {
        for (vars, missing) in [
            (&[][..], "AWS_ACCESS_KEY_ID is not set"),
            (
                &[("AWS_ACCESS_KEY_ID", "AK")][..],
                "AWS_SECRET_ACCESS_KEY is not set",
            ),
            (
                &[("AWS_ACCESS_KEY_ID", "AK"), ("AWS_SECRET_ACCESS_KEY", "")][..],
                "AWS_SECRET_ACCESS_KEY is not set",
            ),
        ] {
            let vars: Vec<(&str, &str)> = vars.to_vec();
            let lookup = move |name: &str| {
                vars.iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| value.to_string())
            };
            match S3Config::new("b", &[], None, lookup) {
                Err(StoreError::BadUri(message)) => {
                    assert!(message.contains(missing), "{message}");
                    assert!(message.contains("no credentials"), "{message}");
                }
                other => panic!("{other:?}"),
            }
        }
        for endpoint in ["127.0.0.1:3900", "ftp://x", "http://h:1/path", "nonsense"] {
            match S3Config::new("b", &params(&[("endpoint", endpoint)]), None, env(KEYS)) {
                Err(StoreError::BadUri(message)) => {
                    assert!(message.contains("endpoint"), "{message}")
                }
                other => panic!("{endpoint}: {other:?}"),
            }
        }
        assert!(matches!(
            S3Config::new("b", &params(&[("pathStyle", "yes")]), None, env(KEYS)),
            Err(StoreError::BadUri(_))
        ));
        // Explicit credentials win over (missing) environment ones.
        let explicit = S3Credentials {
            access_key_id: "X".into(),
            secret_access_key: "Y".into(),
            session_token: None,
        };
        let config = S3Config::new("b", &[], Some(explicit.clone()), env(&[])).unwrap();
        assert_eq!(config.credentials, explicit);
    }

    #[test]
    fn backoff_is_bounded_and_jittered() {
        let config = S3Config::new("b", &[], None, env(KEYS)).unwrap();
        let bucket = S3Bucket::new(config, S3Options::default()).unwrap();
        for attempt in 1..40 {
            let ceiling = Duration::from_millis(50)
                .saturating_mul(1 << (attempt - 1).min(20))
                .min(Duration::from_secs(5));
            let backoff = bucket.backoff(attempt);
            assert!(backoff <= ceiling, "{attempt}: {backoff:?} > {ceiling:?}");
        }
        let samples: std::collections::HashSet<_> = (0..20).map(|_| bucket.backoff(5)).collect();
        assert!(samples.len() > 10, "not jittered: {samples:?}");
    }

    #[test]
    fn transient_answers() {
        let answer = |status: u16, body: &'static str| Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: Bytes::from_static(body.as_bytes()),
        };
        for status in [500, 502, 503, 504, 429, 408] {
            assert!(transient(&answer(status, ""), false).is_some(), "{status}");
        }
        let slow_down = answer(
            503,
            "<Error><Code>SlowDown</Code><Message>Reduce</Message></Error>",
        );
        assert_eq!(
            transient(&slow_down, false).unwrap(),
            "HTTP 503 Service Unavailable SlowDown Reduce"
        );
        assert!(transient(
            &answer(400, "<Error><Code>RequestTimeout</Code></Error>"),
            false
        )
        .is_some());
        for status in [200, 204, 206, 400, 403, 404, 416] {
            assert!(transient(&answer(status, ""), false).is_none(), "{status}");
        }
        let ok_error = answer(
            200,
            "<?xml version=\"1.0\"?><Error><Code>InternalError</Code></Error>",
        );
        assert!(transient(&ok_error, true).is_some());
        assert!(transient(&ok_error, false).is_none());
    }
}
