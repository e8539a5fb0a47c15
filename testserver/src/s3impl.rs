//! The `s3s::S3` implementation over [`Storage`].

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use s3s::dto::*;
use s3s::{Body, S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::hooks::BodyFault;
use crate::multipart::{UploadError, Uploads};
use crate::percent::encode_url;
use crate::storage::{ListEntry, Object, Storage, StorageError};

/// Largest page a listing returns, whatever `max-keys` asks for (as in AWS).
const MAX_KEYS: i32 = 1000;

/// The S3 front end: stateless apart from the shared storage.
pub struct MemS3 {
    pub(crate) storage: Arc<Storage>,
    /// Test knobs (here: how listings treat `encoding-type`).
    pub(crate) hooks: Arc<crate::hooks::Hooks>,
    /// Open multipart uploads.
    pub(crate) uploads: Arc<Uploads>,
}

impl MemS3 {
    /// Applies the test knob on `encoding-type` to a listing request: refuse
    /// it (400 InvalidArgument), drop it (answer raw, unencoded), or keep it.
    fn apply_encoding_mode(&self, requested: &mut Option<EncodingType>) -> S3Result<()> {
        match self
            .hooks
            .encoding_mode
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            2 if requested.is_some() => Err(S3Error::with_message(
                S3ErrorCode::InvalidArgument,
                "encoding-type is not supported",
            )),
            1 => {
                *requested = None;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

fn storage_err(e: StorageError) -> S3Error {
    match e {
        StorageError::NoSuchBucket => S3Error::new(S3ErrorCode::NoSuchBucket),
        StorageError::NoSuchKey => S3Error::new(S3ErrorCode::NoSuchKey),
        StorageError::BucketExists => S3Error::new(S3ErrorCode::BucketAlreadyOwnedByYou),
        StorageError::BucketNotEmpty => S3Error::new(S3ErrorCode::BucketNotEmpty),
    }
}

fn upload_err(e: UploadError) -> S3Error {
    S3Error::new(match e {
        UploadError::NoSuchUpload => S3ErrorCode::NoSuchUpload,
        UploadError::InvalidPartNumber => S3ErrorCode::InvalidArgument,
        UploadError::InvalidPart => S3ErrorCode::InvalidPart,
        UploadError::InvalidPartOrder => S3ErrorCode::InvalidPartOrder,
        UploadError::EntityTooSmall => S3ErrorCode::EntityTooSmall,
    })
}

/// The whole body of a request (empty when it has none).
async fn read_body(body: Option<StreamingBlob>) -> S3Result<Bytes> {
    match body {
        Some(blob) => Body::from(blob)
            .store_all_limited(usize::MAX)
            .await
            .map_err(|e| S3Error::with_source(S3ErrorCode::IncompleteBody, e)),
        None => Ok(Bytes::new()),
    }
}

/// `SystemTime` truncated to whole seconds, as HTTP dates carry it.
fn http_time(t: SystemTime) -> Timestamp {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    Timestamp::from(UNIX_EPOCH + Duration::from_secs(secs))
}

fn etag_dto(obj: &Object) -> ETag {
    ETag::Strong(obj.etag_value().to_owned())
}

fn etag_matches(cond: &ETagCondition, obj: &Object) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == obj.etag_value(),
    }
}

/// Evaluates If-Match / If-Unmodified-Since (412) and If-None-Match /
/// If-Modified-Since (304) in the order RFC 9110 section 13.2.2 gives.
fn check_conditions(
    obj: &Object,
    if_match: Option<&ETagCondition>,
    if_unmodified_since: Option<&Timestamp>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let mtime = http_time(obj.last_modified);
    if let Some(c) = if_match {
        if !etag_matches(c, obj) {
            return Err(S3Error::new(S3ErrorCode::PreconditionFailed));
        }
    } else if let Some(t) = if_unmodified_since
        && mtime > *t
    {
        return Err(S3Error::new(S3ErrorCode::PreconditionFailed));
    }
    if let Some(c) = if_none_match {
        if etag_matches(c, obj) {
            return Err(S3Error::new(S3ErrorCode::NotModified));
        }
    } else if let Some(t) = if_modified_since
        && mtime <= *t
    {
        return Err(S3Error::new(S3ErrorCode::NotModified));
    }
    Ok(())
}

impl MemS3 {
    /// The object an `x-amz-copy-source` names, if it matches
    /// `x-amz-copy-source-if-match` (else PreconditionFailed).
    fn copy_source(
        &self,
        source: &CopySource,
        if_match: Option<&ETagCondition>,
    ) -> S3Result<Object> {
        let CopySource::Bucket { bucket, key, .. } = source else {
            return Err(S3Error::new(S3ErrorCode::NotImplemented));
        };
        let src = self.storage.get(bucket, key).map_err(storage_err)?;
        if let Some(c) = if_match
            && !etag_matches(c, &src)
        {
            return Err(S3Error::new(S3ErrorCode::PreconditionFailed));
        }
        Ok(src)
    }
}

/// Resolves an optional Range against the object size: `(start, end_exclusive,
/// Content-Range)`. Any range on an empty object is unsatisfiable, as in AWS.
fn resolve_range(range: Option<&Range>, size: u64) -> S3Result<Option<(u64, u64, String)>> {
    let Some(r) = range else { return Ok(None) };
    match r.check(size) {
        Ok(rg) => {
            let cr = format!("bytes {}-{}/{}", rg.start, rg.end - 1, size);
            Ok(Some((rg.start, rg.end, cr)))
        }
        Err(_) => Err(S3Error::with_message(
            S3ErrorCode::InvalidRange,
            format!("The requested range is not satisfiable (object size {size})"),
        )),
    }
}

fn hex_encode(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// Splits listing entries into `Contents` and `CommonPrefixes`, applying `enc`
/// (identity, or URL encoding for `encoding-type=url`) to names.
fn split_entries(
    entries: Vec<ListEntry>,
    enc: &dyn Fn(&str) -> String,
) -> (Vec<s3s::dto::Object>, Vec<CommonPrefix>) {
    let mut contents = Vec::new();
    let mut prefixes = Vec::new();
    for e in entries {
        match e {
            ListEntry::Object(key, obj) => contents.push(s3s::dto::Object {
                key: Some(enc(&key)),
                size: Some(obj.data.len() as i64),
                e_tag: Some(etag_dto(&obj)),
                last_modified: Some(Timestamp::from(obj.last_modified)),
                storage_class: Some(ObjectStorageClass::from_static(
                    ObjectStorageClass::STANDARD,
                )),
                ..Default::default()
            }),
            ListEntry::CommonPrefix(p) => prefixes.push(CommonPrefix {
                prefix: Some(enc(&p)),
            }),
        }
    }
    (contents, prefixes)
}

#[async_trait::async_trait]
impl S3 for MemS3 {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let bucket = req.input.bucket;
        self.storage.create_bucket(&bucket).map_err(storage_err)?;
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{bucket}")),
        }))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.storage
            .delete_bucket(&req.input.bucket)
            .map_err(storage_err)?;
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        if !self.storage.bucket_exists(&req.input.bucket) {
            return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
        }
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(crate::REGION.to_owned()),
            ..Default::default()
        }))
    }

    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let buckets = self
            .storage
            .list_buckets()
            .into_iter()
            .map(|(name, created)| Bucket {
                name: Some(name),
                creation_date: Some(Timestamp::from(created)),
                bucket_region: None,
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        if !self.storage.bucket_exists(&input.bucket) {
            return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
        }
        let data = match input.body {
            Some(blob) => Body::from(blob)
                .store_all_limited(usize::MAX)
                .await
                .map_err(|e| S3Error::with_source(S3ErrorCode::IncompleteBody, e))?,
            None => Bytes::new(),
        };
        if input.if_match.is_some() || input.if_none_match.is_some() {
            // Conditional write: checked against the current version (not atomic
            // with the write, which is good enough for a test server).
            match self.storage.get(&input.bucket, &input.key) {
                Ok(cur) => {
                    if input
                        .if_none_match
                        .as_ref()
                        .is_some_and(|c| etag_matches(c, &cur))
                        || input
                            .if_match
                            .as_ref()
                            .is_some_and(|c| !etag_matches(c, &cur))
                    {
                        return Err(S3Error::new(S3ErrorCode::PreconditionFailed));
                    }
                }
                Err(_) if input.if_match.is_some() => {
                    return Err(S3Error::new(S3ErrorCode::NoSuchKey));
                }
                Err(_) => {}
            }
        }
        let size = data.len();
        let etag = self
            .storage
            .put(&input.bucket, &input.key, data, SystemTime::now())
            .map_err(storage_err)?;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(etag.trim_matches('"').to_owned())),
            size: Some(size as i64),
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let i = req.input;
        if !self.storage.bucket_exists(&i.bucket) {
            return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
        }
        let id = self.uploads.create(&i.bucket, &i.key);
        if self.hooks.take_lost("CreateMultipartUpload") {
            return Err(crate::hooks::injected_error(500));
        }
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let i = req.input;
        let data = read_body(i.body).await?;
        let etag = self
            .uploads
            .put_part(&i.bucket, &i.key, &i.upload_id, i.part_number, data)
            .map_err(upload_err)?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(etag.trim_matches('"').to_owned())),
            ..Default::default()
        }))
    }

    /// UploadPartCopy from an object of this server: its whole body, or
    /// `bytes=first-last` of it (inclusive, within the object), with
    /// `x-amz-copy-source-if-match`.
    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let i = req.input;
        let src = self.copy_source(&i.copy_source, i.copy_source_if_match.as_ref())?;
        let len = src.data.len() as u64;
        let (first, end) = match &i.copy_source_range {
            None => (0, len),
            Some(r) => {
                let parsed = r.strip_prefix("bytes=").and_then(|r| {
                    let (a, b) = r.split_once('-')?;
                    Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
                });
                match parsed {
                    Some((a, b)) if a <= b && b < len => (a, b + 1),
                    _ => return Err(S3Error::new(S3ErrorCode::InvalidRange)),
                }
            }
        };
        let data = src.data.slice(first as usize..end as usize);
        let etag = self
            .uploads
            .put_part(&i.bucket, &i.key, &i.upload_id, i.part_number, data)
            .map_err(upload_err)?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(etag.trim_matches('"').to_owned())),
                last_modified: Some(Timestamp::from(SystemTime::now())),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let i = req.input;
        let parts: Vec<(i32, String)> = i
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                let etag = p.e_tag.map(|e| e.value().to_owned()).unwrap_or_default();
                (p.part_number.unwrap_or(0), etag)
            })
            .collect();
        let (data, etag) = self
            .uploads
            .complete(&i.bucket, &i.key, &i.upload_id, &parts)
            .map_err(upload_err)?;
        self.storage
            .put_with_etag(&i.bucket, &i.key, data, etag.clone(), SystemTime::now())
            .map_err(storage_err)?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            e_tag: Some(ETag::Strong(etag.trim_matches('"').to_owned())),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = req.input;
        self.uploads
            .abort(&i.bucket, &i.key, &i.upload_id)
            .map_err(upload_err)?;
        Ok(S3Response::with_status(
            AbortMultipartUploadOutput::default(),
            http::StatusCode::NO_CONTENT,
        ))
    }

    /// All open uploads under the prefix in one answer (no paging: a test
    /// server holds few).
    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = req.input;
        if !self.storage.bucket_exists(&i.bucket) {
            return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
        }
        let prefix = i.prefix.clone().unwrap_or_default();
        let uploads = self
            .uploads
            .list(&i.bucket, &prefix)
            .into_iter()
            .map(|u| MultipartUpload {
                key: Some(u.key),
                upload_id: Some(u.upload_id),
                initiated: Some(Timestamp::from(u.initiated)),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: i.prefix,
            is_truncated: Some(false),
            uploads: Some(uploads),
            ..Default::default()
        }))
    }

    /// CopyObject within the server, with `x-amz-copy-source-if-match`.
    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let i = req.input;
        let src = self.copy_source(&i.copy_source, i.copy_source_if_match.as_ref())?;
        // As S3: the copy is a new single-part object, so its ETag is the
        // MD5 of its bytes even when the source was a multipart upload.
        let now = SystemTime::now();
        let etag = self
            .storage
            .put(&i.bucket, &i.key, src.data.clone(), now)
            .map_err(storage_err)?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(etag.trim_matches('"').to_owned())),
                last_modified: Some(Timestamp::from(now)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.storage
            .delete(&req.input.bucket, &req.input.key)
            .map_err(storage_err)?;
        Ok(S3Response::with_status(
            DeleteObjectOutput::default(),
            http::StatusCode::NO_CONTENT,
        ))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let i = req.input;
        let obj = self.storage.get(&i.bucket, &i.key).map_err(storage_err)?;
        check_conditions(
            &obj,
            i.if_match.as_ref(),
            i.if_unmodified_since.as_ref(),
            i.if_none_match.as_ref(),
            i.if_modified_since.as_ref(),
        )?;
        let size = obj.data.len() as u64;
        let range = resolve_range(i.range.as_ref(), size)?;
        let (len, content_range) = match range {
            Some((s, e, cr)) => (e - s, Some(cr)),
            None => (size, None),
        };
        let out = HeadObjectOutput {
            accept_ranges: Some("bytes".to_owned()),
            content_length: Some(len as i64),
            content_range,
            e_tag: Some(etag_dto(&obj)),
            last_modified: Some(Timestamp::from(obj.last_modified)),
            ..Default::default()
        };
        Ok(S3Response::new(out))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let range = req
            .headers
            .get(http::header::RANGE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let i = req.input;
        self.hooks.add_get_range(&i.key, range);
        let obj = self.storage.get(&i.bucket, &i.key).map_err(storage_err)?;
        check_conditions(
            &obj,
            i.if_match.as_ref(),
            i.if_unmodified_since.as_ref(),
            i.if_none_match.as_ref(),
            i.if_modified_since.as_ref(),
        )?;
        let size = obj.data.len() as u64;
        let (data, content_range) = match resolve_range(i.range.as_ref(), size)? {
            Some((s, e, cr)) => (obj.data.slice(s as usize..e as usize), Some(cr)),
            None => (obj.data.clone(), None),
        };
        let length = data.len() as i64;
        let body = match self.hooks.take_body_fault(&i.key) {
            None => {
                self.hooks.add_body_bytes(data.len() as u64);
                if self.hooks.paced() {
                    paced_body(data, self.hooks.clone())
                } else if let Some(d) = self.hooks.body_delay(&i.key) {
                    delayed_body(data, d)
                } else {
                    StreamingBlob::from(Body::from(data))
                }
            }
            Some(fault) => {
                let (after, stall) = match fault {
                    BodyFault::Cut(n) => (n, false),
                    BodyFault::Stall(n) => (n, true),
                };
                let head = data.slice(..after.min(data.len()));
                self.hooks.add_body_bytes(head.len() as u64);
                broken_body(head, stall)
            }
        };
        let out = GetObjectOutput {
            accept_ranges: Some("bytes".to_owned()),
            content_length: Some(length),
            content_range,
            e_tag: Some(etag_dto(&obj)),
            last_modified: Some(Timestamp::from(obj.last_modified)),
            body: Some(body),
            ..Default::default()
        };
        Ok(S3Response::new(out))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let mut i = req.input;
        let max_keys = i.max_keys.unwrap_or(MAX_KEYS).clamp(0, MAX_KEYS);
        let prefix = i.prefix.clone().unwrap_or_default();
        let page = self
            .storage
            .list(
                &i.bucket,
                &prefix,
                i.delimiter.as_deref(),
                i.marker.as_deref().filter(|m| !m.is_empty()),
                max_keys as usize,
            )
            .map_err(storage_err)?;
        self.apply_encoding_mode(&mut i.encoding_type)?;
        let url = i
            .encoding_type
            .as_ref()
            .is_some_and(|e| e.as_str() == EncodingType::URL);
        let enc = |s: &str| if url { encode_url(s) } else { s.to_owned() };
        let (contents, prefixes) = split_entries(page.entries, &enc);
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            prefix: Some(enc(&prefix)),
            delimiter: i.delimiter.as_deref().map(enc),
            marker: Some(i.marker.as_deref().map(enc).unwrap_or_default()),
            max_keys: Some(max_keys),
            is_truncated: Some(page.next_marker.is_some()),
            // AWS only sends NextMarker with a delimiter; sending it always is
            // harmless and saves clients from deriving it.
            next_marker: page.next_marker.as_deref().map(enc),
            contents: (!contents.is_empty()).then_some(contents),
            common_prefixes: (!prefixes.is_empty()).then_some(prefixes),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let mut i = req.input;
        let max_keys = i.max_keys.unwrap_or(MAX_KEYS).clamp(0, MAX_KEYS);
        let prefix = i.prefix.clone().unwrap_or_default();
        let after = match &i.continuation_token {
            Some(t) => Some(hex_decode(t).ok_or_else(|| {
                S3Error::with_message(
                    S3ErrorCode::InvalidArgument,
                    "The continuation token provided is incorrect",
                )
            })?),
            None => i.start_after.clone().filter(|s| !s.is_empty()),
        };
        let page = self
            .storage
            .list(
                &i.bucket,
                &prefix,
                i.delimiter.as_deref(),
                after.as_deref(),
                max_keys as usize,
            )
            .map_err(storage_err)?;

        self.apply_encoding_mode(&mut i.encoding_type)?;
        let url = i
            .encoding_type
            .as_ref()
            .is_some_and(|e| e.as_str() == EncodingType::URL);
        let enc = |s: &str| if url { encode_url(s) } else { s.to_owned() };

        let key_count = page.entries.len() as i32;
        let (contents, prefixes) = split_entries(page.entries, &enc);
        let out = ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(enc(&prefix)),
            delimiter: i.delimiter.as_deref().map(enc),
            max_keys: Some(max_keys),
            key_count: Some(key_count),
            continuation_token: i.continuation_token,
            start_after: i.start_after.as_deref().map(enc),
            is_truncated: Some(page.next_marker.is_some()),
            next_continuation_token: page.next_marker.as_deref().map(hex_encode),
            contents: (!contents.is_empty()).then_some(contents),
            common_prefixes: (!prefixes.is_empty()).then_some(prefixes),
            encoding_type: i.encoding_type,
            ..Default::default()
        };
        Ok(S3Response::new(out))
    }
}

/// `data` in 64 KiB chunks, each sent once the shared link
/// (`Hooks::set_body_rate`) has had the time to carry it.
fn paced_body(data: bytes::Bytes, hooks: Arc<crate::hooks::Hooks>) -> StreamingBlob {
    use futures::StreamExt;
    const CHUNK: usize = 64 << 10;
    let chunks: Vec<bytes::Bytes> = (0..data.len())
        .step_by(CHUNK)
        .map(|at| data.slice(at..(at + CHUNK).min(data.len())))
        .collect();
    let stream = futures::stream::iter(chunks).then(move |chunk| {
        let hooks = hooks.clone();
        async move {
            if let Some(done) = hooks.reserve_body(chunk.len()) {
                tokio::time::sleep_until(done.into()).await;
            }
            Ok::<_, std::io::Error>(chunk)
        }
    });
    StreamingBlob::wrap(stream)
}

/// `data` as a body whose first byte comes `delay` after the headers.
fn delayed_body(data: bytes::Bytes, delay: std::time::Duration) -> StreamingBlob {
    let late = futures::stream::once(async move {
        tokio::time::sleep(delay).await;
        Ok::<_, std::io::Error>(data)
    });
    StreamingBlob::wrap(late)
}

/// A body that sends `head` and then fails (`stall` false) or sends nothing
/// more and stays open (`stall` true).
fn broken_body(head: bytes::Bytes, stall: bool) -> StreamingBlob {
    use futures::StreamExt;
    let first = futures::stream::iter([Ok::<_, std::io::Error>(head)]);
    if stall {
        StreamingBlob::wrap(first.chain(futures::stream::pending()))
    } else {
        // The pause lets the server flush `head` before the failure drops
        // the connection with whatever is still in its write buffer.
        let cut = futures::stream::once(async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            Err(std::io::Error::other("injected body cut"))
        });
        StreamingBlob::wrap(first.chain(cut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trip() {
        for s in ["", "a/b", "é #+%"] {
            assert_eq!(hex_decode(&hex_encode(s)).as_deref(), Some(s));
        }
        assert_eq!(hex_decode("zz"), None);
        assert_eq!(hex_decode("abc"), None);
    }
}
