//! The `s3://` backend's configuration: the tuning ([`S3Options`]) and where the bucket is and
//! how to sign for it ([`S3Config`], from the URI and the environment), with the URL of a call.

use std::time::Duration;

use reqwest::Url;

use crate::limits;
use crate::sigv4;
use crate::sigv4::S3Credentials;
use crate::StoreError;

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
    /// A probe that finds the store unreachable (no answer but transient ones within the
    /// call's deadline) is logged and the store opens anyway, with
    /// [`crate::ObjectStore::unreachable_at_open`] saying so: for a node that has data of its
    /// own to serve meanwhile. A definite refusal (a wrong secret, no such bucket) still fails
    /// the open.
    pub open_when_unreachable: bool,
    /// `None`: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` from the
    /// environment.
    pub credentials: Option<S3Credentials>,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            multipart_threshold: limits::S3_MULTIPART_THRESHOLD_BYTES,
            part_size: limits::S3_PART_BYTES,
            list_page_size: limits::S3_LIST_PAGE_KEYS,
            max_attempts: limits::S3_MAX_ATTEMPTS,
            deadline: Duration::from_secs(limits::S3_CALL_DEADLINE_SECS),
            attempt_timeout: Duration::from_secs(limits::S3_ATTEMPT_TIMEOUT_SECS),
            connect_timeout: Duration::from_secs(limits::S3_CONNECT_TIMEOUT_SECS),
            base_backoff: Duration::from_millis(limits::S3_BASE_BACKOFF_MS),
            max_backoff: Duration::from_millis(limits::S3_MAX_BACKOFF_MS),
            probe_at_open: true,
            open_when_unreachable: false,
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
    pub(super) fn url(&self, key: Option<&str>, query: &str) -> Result<Url, StoreError> {
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
    pub(super) fn describe(&self) -> String {
        format!(
            "bucket \"{}\" at {} (region {})",
            self.bucket,
            self.endpoint.as_str().trim_end_matches('/'),
            self.region
        )
    }
}
