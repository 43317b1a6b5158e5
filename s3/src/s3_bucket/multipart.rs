//! Multipart puts: create the upload, send the parts (a few at once), complete it, or abort it
//! on failure. Parts are at least S3's minimum and never more than S3's part count.

use std::sync::Arc;

use bytes::Bytes;
use reqwest::Method;

use super::call::{is_error_body, Call};
use super::client::S3Bucket;
use crate::limits::{S3_MAX_PARTS, S3_MIN_PART_BYTES, S3_PARTS_IN_FLIGHT};
use crate::xml;
use crate::StoreError;

impl S3Bucket {
    pub(super) async fn put_multipart(
        self: Arc<Self>,
        key: &str,
        data: Bytes,
    ) -> Result<(), StoreError> {
        let what = format!("multipart put {key} ({} bytes)", data.len());
        let part_size = self
            .options
            .part_size
            .max(S3_MIN_PART_BYTES)
            .max(data.len().div_ceil(S3_MAX_PARTS));
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
            while next < count && running.len() < S3_PARTS_IN_FLIGHT {
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
}
