//! [`WriteStore`] for [`S3Store`]: PutObject, multipart upload, CopyObject
//! and DeleteObject through the SDK, whose standard retry strategy retries
//! transient faults (the request bodies are in memory, so every attempt can
//! resend them).
//!
//! An upload's attempt timeout grows with its body: `s3.attempt_timeout_secs`
//! plus one second per [`MIN_UPLOAD_RATE`] bytes, so a 64 MiB part on a slow
//! link is not cut off while one that stops is.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use bytes::Bytes;

use super::s3::{S3Store, map_sdk_error};
use super::{PendingUpload, StoreError, UploadedPart, WriteStore};
use crate::telemetry::metrics as m;

/// Slowest upload rate an attempt is given time for, bytes per second.
pub const MIN_UPLOAD_RATE: u64 = 1 << 20;

impl S3Store {
    /// Per-request timeouts of a request with a body of `len` bytes.
    fn upload_timeouts(&self, len: u64) -> aws_sdk_s3::config::Builder {
        let attempt = self.attempt_timeout + Duration::from_secs(len / MIN_UPLOAD_RATE);
        aws_sdk_s3::config::Builder::new().timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(attempt)
                .operation_timeout(attempt * self.max_attempts)
                .build(),
        )
    }
}

/// Counts the attempts of one request (an SDK interceptor).
#[derive(Clone, Debug, Default)]
struct Attempts(Arc<AtomicU32>);

impl Attempts {
    fn count(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Intercept for Attempts {
    fn name(&self) -> &'static str {
        "Attempts"
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// How much earlier than the upload a create finally answered, by the
/// server's clock, an upload made by one of that create's earlier attempts
/// may be, beyond the create's own duration: S3 gives `Initiated` to the
/// millisecond, some servers to the second.
const LOST_CREATE_MARGIN: Duration = Duration::from_secs(1);

impl S3Store {
    /// After a CreateMultipartUpload of `key` that took `took` and more
    /// than one attempt answered `id`: aborts the other uploads of exactly
    /// `key` initiated during that create, made by attempts whose answers
    /// were lost (a reset or a timeout after the server acted). Nobody
    /// knows their ids, so nothing else would ever abort them, and S3
    /// bills their parts until a lifecycle rule does. Failures are logged,
    /// never the create's.
    async fn abort_lost_creates(&self, key: &str, id: &str, took: Duration) {
        let pending = match self.list_multipart(key).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(key = %key.escape_debug(), "could not list the multipart uploads a retried create may have left: {e}");
                return;
            }
        };
        // Without a time of ours (a server that sends none) no upload can
        // be dated against it: none is aborted.
        let Some(ours) = pending
            .iter()
            .find(|u| u.upload_id == id)
            .map(|u| u.initiated)
            .filter(|t| *t != SystemTime::UNIX_EPOCH)
        else {
            return;
        };
        let from = ours
            .checked_sub(took + LOST_CREATE_MARGIN)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        for u in pending
            .iter()
            .filter(|u| u.key == key && u.upload_id != id && (from..=ours).contains(&u.initiated))
        {
            tracing::info!(key = %key.escape_debug(), upload_id = %u.upload_id,
                "aborting the multipart upload of a CreateMultipartUpload attempt whose answer was lost");
            if let Err(e) = self.abort_multipart(key, &u.upload_id).await {
                tracing::warn!(key = %key.escape_debug(), upload_id = %u.upload_id, "abort failed: {e}");
            }
        }
    }
}

/// Records one finished request and maps its error.
fn finish<T, E>(
    op: &'static str,
    start: Instant,
    res: Result<
        T,
        aws_sdk_s3::error::SdkError<E, aws_smithy_runtime_api::client::orchestrator::HttpResponse>,
    >,
    ok_status: &str,
) -> Result<T, StoreError>
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match res {
        Ok(out) => {
            m::s3_request(op, ok_status, start.elapsed());
            Ok(out)
        }
        Err(e) => {
            let (err, status) = map_sdk_error(e);
            m::s3_request(op, &status, start.elapsed());
            Err(err)
        }
    }
}

impl WriteStore for S3Store {
    async fn put(&self, key: &str, data: Bytes) -> Result<String, StoreError> {
        let len = data.len() as u64;
        let start = Instant::now();
        let req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(data))
            .customize()
            .config_override(self.upload_timeouts(len));
        let res = if self.sign_payload {
            req.send().await
        } else {
            req.disable_payload_signing().send().await
        };
        let out = finish(m::OP_PUT, start, res, "200")?;
        m::s3_bytes_sent(len);
        etag_of(out.e_tag(), "PutObject", key)
    }

    async fn create_multipart(&self, key: &str) -> Result<String, StoreError> {
        let start = Instant::now();
        let attempts = Attempts::default();
        let res = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .customize()
            .interceptor(attempts.clone())
            .send()
            .await;
        let out = finish(m::OP_CREATE_MULTIPART, start, res, "200")?;
        let id = out.upload_id().map(str::to_string).ok_or_else(|| {
            StoreError::Other(format!("CreateMultipartUpload {key}: no upload id"))
        })?;
        if attempts.count() > 1 {
            self.abort_lost_creates(key, &id, start.elapsed()).await;
        }
        Ok(id)
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        data: Bytes,
    ) -> Result<String, StoreError> {
        let len = data.len() as u64;
        let start = Instant::now();
        let req = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number as i32)
            .body(ByteStream::from(data))
            .customize()
            .config_override(self.upload_timeouts(len));
        let res = if self.sign_payload {
            req.send().await
        } else {
            req.disable_payload_signing().send().await
        };
        let out = finish(m::OP_UPLOAD_PART, start, res, "200")?;
        m::s3_bytes_sent(len);
        out.e_tag()
            .map(str::to_string)
            .ok_or_else(|| StoreError::Other(format!("UploadPart {key} #{number}: no ETag")))
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[UploadedPart],
    ) -> Result<String, StoreError> {
        let completed = CompletedMultipartUpload::builder()
            .set_parts(Some(
                parts
                    .iter()
                    .map(|p| {
                        CompletedPart::builder()
                            .part_number(p.number as i32)
                            .e_tag(&p.etag)
                            .build()
                    })
                    .collect(),
            ))
            .build();
        let start = Instant::now();
        // The server may take a while to join many parts.
        let res = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(completed)
            .customize()
            .config_override(self.upload_timeouts(parts.len() as u64 * MIN_UPLOAD_RATE / 100))
            .send()
            .await;
        let out = finish(m::OP_COMPLETE_MULTIPART, start, res, "200")?;
        etag_of(out.e_tag(), "CompleteMultipartUpload", key)
    }

    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        let start = Instant::now();
        let res = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await;
        match finish(m::OP_ABORT_MULTIPART, start, res, "204") {
            Ok(_) | Err(StoreError::NoSuchUpload) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn list_multipart(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        let mut out = Vec::new();
        let (mut key_marker, mut id_marker) = (None::<String>, None::<String>);
        let mut last = (None, None);
        loop {
            let start = Instant::now();
            let res = self
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_key_marker(key_marker.take())
                .set_upload_id_marker(id_marker.take())
                .send()
                .await;
            let page = finish(m::OP_LIST_MULTIPART, start, res, "200")?;
            for u in page.uploads() {
                let (Some(key), Some(id)) = (u.key(), u.upload_id()) else {
                    continue;
                };
                out.push(PendingUpload {
                    key: key.to_string(),
                    upload_id: id.to_string(),
                    initiated: u
                        .initiated()
                        .and_then(|t| SystemTime::try_from(*t).ok())
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
            if !page.is_truncated().unwrap_or(false) {
                return Ok(out);
            }
            let next = (
                page.next_key_marker().map(str::to_string),
                page.next_upload_id_marker().map(str::to_string),
            );
            // A truncated page must move the markers on, or the loop would
            // ask for the same page forever.
            if next.0.is_none() || next == last {
                return Err(StoreError::Other(
                    "ListMultipartUploads: truncated page without new markers".into(),
                ));
            }
            last = next.clone();
            (key_marker, id_marker) = next;
        }
    }

    async fn copy(&self, from: &str, etag: &str, to: &str) -> Result<String, StoreError> {
        // x-amz-copy-source is `bucket/key`, URL-encoded (CopyObject in the
        // Amazon S3 API reference); `/` stays as it is.
        let source = format!("{}/{}", self.bucket, encode_copy_source(from));
        let start = Instant::now();
        let res = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(to)
            .copy_source(source)
            .set_copy_source_if_match((!etag.is_empty()).then(|| etag.to_string()))
            .customize()
            .config_override(self.upload_timeouts(super::MAX_PART_SIZE / 100))
            .send()
            .await;
        let out = finish(m::OP_COPY, start, res, "200")?;
        etag_of(
            out.copy_object_result().and_then(|r| r.e_tag()),
            "CopyObject",
            to,
        )
    }

    async fn copy_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        from: &str,
        etag: &str,
        range: std::ops::Range<u64>,
    ) -> Result<String, StoreError> {
        let source = format!("{}/{}", self.bucket, encode_copy_source(from));
        let start = Instant::now();
        let res = self
            .client
            .upload_part_copy()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number as i32)
            .copy_source(source)
            // Inclusive byte range (UploadPartCopy in the Amazon S3 API reference).
            .copy_source_range(format!("bytes={}-{}", range.start, range.end - 1))
            .set_copy_source_if_match((!etag.is_empty()).then(|| etag.to_string()))
            .customize()
            .config_override(self.upload_timeouts((range.end - range.start) / 100))
            .send()
            .await;
        let out = finish(m::OP_UPLOAD_PART_COPY, start, res, "200")?;
        etag_of(
            out.copy_part_result().and_then(|r| r.e_tag()),
            "UploadPartCopy",
            key,
        )
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let start = Instant::now();
        let res = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await;
        match finish(m::OP_DELETE, start, res, "204") {
            Ok(_) | Err(StoreError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The ETag an answer that wrote `key` carried. Without one the new object
/// could not be pinned (If-Match) when read or copied: an error.
fn etag_of(etag: Option<&str>, op: &str, key: &str) -> Result<String, StoreError> {
    match etag {
        Some(e) if !e.is_empty() => Ok(e.to_string()),
        _ => Err(StoreError::Other(format!(
            "{op} {key}: answer without an ETag"
        ))),
    }
}

/// Percent-encodes a key for `x-amz-copy-source`: every byte but the
/// unreserved ones (RFC 3986, section 2.3) and `/`.
fn encode_copy_source(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_sources_are_percent_encoded_but_slashes() {
        assert_eq!(encode_copy_source("a/b c+d%é"), "a/b%20c%2Bd%25%C3%A9");
    }
}
