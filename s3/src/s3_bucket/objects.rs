//! The object operations on the bucket: probe, put (one request, or multipart above the
//! threshold), get, ranged get, delete and the paged list.

use std::sync::Arc;

use bytes::Bytes;
use reqwest::Method;
use reqwest::StatusCode;

use super::call::{AnswerLimit, Call};
use super::client::S3Bucket;
use crate::backend::check_range;
use crate::xml;
use crate::StoreError;

/// Why a bucket's probe at open failed.
pub(crate) enum ProbeError {
    /// No answer but transient ones: the bucket may be away for a while.
    Unreachable(StoreError),
    /// The store answered no: a setting is wrong.
    Refused(StoreError),
}

impl S3Bucket {
    /// Lists at most one key: proves the endpoint answers, the bucket exists and the
    /// credentials are accepted. An endpoint that gave no answer but transient ones (no
    /// connection, timeouts, `5xx`, `429`) within the call's deadline is
    /// [`ProbeError::Unreachable`]; a definite refusal (a wrong secret, no such bucket) is
    /// [`ProbeError::Refused`].
    pub(crate) async fn probe(&self) -> Result<(), ProbeError> {
        let call = Call::new(Method::GET, None)
            .query("list-type", "2")
            .query("max-keys", "1");
        let what = format!("open {}", self.config.describe());
        let answer = self
            .execute(&what, &call)
            .await
            .map_err(ProbeError::Unreachable)?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(ProbeError::Refused(self.failure(&what, &answer)))
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

    /// The object's first `bytes_max` bytes (all of it if shorter): a plain GET whose body is
    /// cut at `bytes_max` and its connection dropped.
    pub(crate) async fn get(&self, key: &str, bytes_max: usize) -> Result<Bytes, StoreError> {
        let what = format!("get {key}");
        let call = Call::new(Method::GET, Some(key)).answer_limit(AnswerLimit::Prefix(bytes_max));
        let answer = self.execute(&what, &call).await?;
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
            .header("range", &format!("bytes={start}-{}", end - 1))
            .answer_limit(AnswerLimit::Range { start, end });
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
}
