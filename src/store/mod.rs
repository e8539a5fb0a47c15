//! The object store layer: two small async traits, [`ObjectStore`] (reads)
//! and [`WriteStore`] (PUT, multipart upload, copy, delete), with typed
//! errors ([`StoreError`]). `store/s3.rs`, `store/get.rs` and
//! `store/upload.rs` are the only importers of `aws-sdk-s3`; `store/mem.rs`
//! is an in-memory store for unit tests of logic above this layer.
//!
//! Keys passed to and returned from this layer are full object keys in the bucket
//! (the mount prefix already applied).

mod get;
mod hedge;
pub mod mem;
pub mod pool;
pub mod s3;
pub mod segments;
mod sigv4;
mod upload;

use std::future::Future;
use std::ops::Range;
use std::time::SystemTime;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

pub use hedge::Urgency;
pub use segments::Segments;

/// Maximum keys one ListObjectsV2 page returns (the S3 API limit, see
/// "ListObjectsV2 - MaxKeys" in the Amazon S3 API reference).
pub const MAX_KEYS_PER_PAGE: i32 = 1000;

/// Longest object key, in bytes of its UTF-8 encoding (Amazon S3 User
/// Guide, "Naming Amazon S3 objects": up to 1,024 bytes).
pub const MAX_KEY_BYTES: usize = 1024;

/// What a listing or HEAD says about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Full object key.
    pub key: String,
    /// Object size in bytes.
    pub size: u64,
    /// The ETag as the server sent it (quotes included when sent).
    pub etag: String,
    /// LastModified (UTC). `UNIX_EPOCH` when the server sent none.
    pub last_modified: SystemTime,
}

/// One page of a ListObjectsV2 answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    /// Objects in key order.
    pub objects: Vec<ObjectMeta>,
    /// Common prefixes (each ends with the delimiter) in key order.
    pub common_prefixes: Vec<String>,
    /// Continuation token for the next page; `None` on the last page.
    pub next_token: Option<String>,
}

/// Typed store errors. The `fs` layer maps them to errno in one place.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The key does not exist (404 NoSuchKey / NotFound).
    #[error("object not found")]
    NotFound,
    /// The bucket does not exist (404 NoSuchBucket).
    #[error("bucket does not exist")]
    NoSuchBucket,
    /// A ListObjectsV2 answered 404 without S3's NoSuchBucket code: no
    /// listing is "not found", so the endpoint is not an S3 server for this
    /// bucket (a proxy, a web server) or it failed. EIO, never ENOENT.
    #[error("ListObjectsV2 answered 404 without NoSuchBucket: {0}")]
    ListNotFound(String),
    /// The object changed since the ETag the request was pinned to (412).
    #[error("object changed since it was opened (ETag mismatch)")]
    PreconditionFailed,
    /// Access denied (403) or bad credentials.
    #[error("access denied: {0}")]
    AccessDenied(String),
    /// No credentials could be loaded from any source of the AWS chain, so no
    /// request was sent (EACCES in the file system).
    #[error("no usable AWS credentials: {0}")]
    NoCredentials(String),
    /// A multipart upload id the server does not know (404 NoSuchUpload):
    /// aborted, completed, or never created. EIO, never ENOENT.
    #[error("no such multipart upload")]
    NoSuchUpload,
    /// The requested range is not satisfiable (416).
    #[error("requested range not satisfiable")]
    InvalidRange,
    /// Throttling (503 SlowDown) that outlasted the retries. Never ENOENT.
    #[error("throttled by the server: {0}")]
    Throttled(String),
    /// Network failure, timeout or server fault (5xx) that outlasted the retries.
    #[error("transient failure: {0}")]
    Transient(String),
    /// The request was signed for another region than the bucket's, which
    /// the answer names (AuthorizationHeaderMalformed, or a 301
    /// PermanentRedirect): `expected`, and the server's message.
    #[error("{message} (the server names region {expected:?})")]
    WrongRegion {
        /// The region the server asks for.
        expected: String,
        /// The server's answer, as status, code and message.
        message: String,
    },
    /// Anything else the server or client reported.
    #[error("{0}")]
    Other(String),
}

/// The object store as lakemount needs it. Implementations retry transient
/// faults themselves; an `Err` is final for that call.
pub trait ObjectStore: Send + Sync + 'static {
    /// One ListObjectsV2 page of keys starting with `prefix`, grouped by
    /// `delimiter` when given, at most `max_keys` (<= [`MAX_KEYS_PER_PAGE`]) entries.
    /// `continuation` resumes a listing (the previous page's `next_token`);
    /// without it, `start_after` (ListObjectsV2 `StartAfter`) starts the listing
    /// at the first key that sorts (by UTF-8 bytes) after it. S3 ignores
    /// `StartAfter` when a continuation token is given.
    fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation: Option<String>,
        start_after: Option<&str>,
        max_keys: i32,
    ) -> impl Future<Output = Result<ListPage, StoreError>> + Send;

    /// HeadObject of `key`.
    fn head(&self, key: &str) -> impl Future<Output = Result<ObjectMeta, StoreError>> + Send;

    /// Ranged GET of `range` (bytes, end exclusive, non-empty) of `key`, pinned to
    /// `etag` with `If-Match`: a changed object gives
    /// [`StoreError::PreconditionFailed`], never bytes of another version.
    fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> impl Future<Output = Result<Bytes, StoreError>> + Send;

    /// [`Self::get_range`] for a GET sent ahead of its reader (read-ahead,
    /// prefetch): a late one is hedged only once `urgency` is marked (a
    /// reader waits for it). Stores that do not hedge ignore it.
    fn get_range_ahead(
        &self,
        key: &str,
        range: Range<u64>,
        etag: &str,
        urgency: Urgency,
    ) -> impl Future<Output = Result<Bytes, StoreError>> + Send {
        let _ = urgency;
        self.get_range(key, range, etag)
    }
}

/// Most parts one multipart upload may have (S3 limit, "Amazon S3 multipart
/// upload limits" in the Amazon S3 User Guide).
pub const MAX_PARTS: u32 = 10_000;
/// Smallest size of a part other than the last, bytes (S3 limit: 5 MiB).
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// Largest part, and largest object one PutObject or CopyObject may write,
/// bytes (S3 limit: 5 GiB).
pub const MAX_PART_SIZE: u64 = 5 << 30;

/// One uploaded part, as CompleteMultipartUpload names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadedPart {
    /// Part number, 1 to [`MAX_PARTS`].
    pub number: u32,
    /// The part's ETag as UploadPart returned it.
    pub etag: String,
}

/// A multipart upload neither completed nor aborted, as
/// ListMultipartUploads shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingUpload {
    /// Full object key.
    pub key: String,
    /// The upload id.
    pub upload_id: String,
    /// When it was created (`UNIX_EPOCH` when the server sent no time).
    pub initiated: SystemTime,
}

/// The write half of the object store, for writable mounts. Implementations
/// retry transient faults themselves; an `Err` is final for that call.
/// Every method that writes an object returns its new ETag.
pub trait WriteStore: Send + Sync + 'static {
    /// PutObject of `data` (at most [`MAX_PART_SIZE`] bytes) as `key`.
    fn put(
        &self,
        key: &str,
        data: Bytes,
    ) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// CreateMultipartUpload of `key`: the upload id.
    fn create_multipart(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// UploadPart `number` (1 to [`MAX_PARTS`]) of upload `upload_id` of
    /// `key`: the part's ETag. Every part but the last must hold at least
    /// [`MIN_PART_SIZE`] bytes (checked by the server at completion).
    fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        data: Bytes,
    ) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// CompleteMultipartUpload of `upload_id` of `key` from `parts`, in
    /// ascending part order. [`StoreError::NoSuchUpload`] when the server
    /// does not know the upload, which a retry after a lost answer to a
    /// completion that succeeded also gets: the caller checks the object.
    fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[UploadedPart],
    ) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// AbortMultipartUpload: the server drops the uploaded parts. An upload
    /// already gone (404 NoSuchUpload) is not an error; any other 404 is.
    fn abort_multipart(
        &self,
        key: &str,
        upload_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every upload pending under `prefix` (ListMultipartUploads, all pages).
    fn list_multipart(
        &self,
        prefix: &str,
    ) -> impl Future<Output = Result<Vec<PendingUpload>, StoreError>> + Send;

    /// CopyObject of `from` at `etag` (`x-amz-copy-source-if-match`: a
    /// changed source gives [`StoreError::PreconditionFailed`]) to `to`, at
    /// most [`MAX_PART_SIZE`] bytes.
    fn copy(
        &self,
        from: &str,
        etag: &str,
        to: &str,
    ) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// UploadPartCopy: part `number` of upload `upload_id` of `key` from
    /// bytes `range` (end exclusive, at most [`MAX_PART_SIZE`]) of `from` at
    /// `etag` (`x-amz-copy-source-if-match`: a changed source gives
    /// [`StoreError::PreconditionFailed`]): the part's ETag.
    fn copy_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        from: &str,
        etag: &str,
        range: Range<u64>,
    ) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// DeleteObject of `key`; deleting a missing key succeeds, as in S3.
    fn delete(&self, key: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// UploadPartCopy requests of one copy in flight at once.
const COPY_PARTS_IN_FLIGHT: usize = 4;

/// Copies `from` (at `etag`, `size` bytes) to `to` in the bucket: one
/// CopyObject when `size` is at most `max_copy` bytes, else a multipart
/// upload of UploadPartCopy parts of `max_copy` bytes (more when 10,000
/// such parts would not hold it; the last part shorter), each pinned to
/// `etag`. A failed part aborts the upload, so no parts are left behind.
/// `max_copy` is clamped to [`MIN_PART_SIZE`]..=[`MAX_PART_SIZE`]. Returns
/// the new object's ETag. Errors: the store's; [`StoreError::Other`] for an
/// object past 10,000 parts of 5 GiB.
pub async fn copy_object<S: WriteStore>(
    store: &S,
    from: &str,
    etag: &str,
    size: u64,
    to: &str,
    max_copy: u64,
) -> Result<String, StoreError> {
    let max_copy = max_copy.clamp(MIN_PART_SIZE, MAX_PART_SIZE);
    if size <= max_copy {
        return store.copy(from, etag, to).await;
    }
    let part = max_copy.max(size.div_ceil(u64::from(MAX_PARTS)));
    if part > MAX_PART_SIZE {
        return Err(StoreError::Other(format!(
            "copying {from}: {size} bytes do not fit {MAX_PARTS} parts of {MAX_PART_SIZE}"
        )));
    }
    let id = store.create_multipart(to).await?;
    let parts = size.div_ceil(part) as u32;
    let copies = futures::stream::iter(1..=parts).map(|number| {
        let start = u64::from(number - 1) * part;
        let range = start..(start + part).min(size);
        let id = &id;
        async move {
            let etag = store.copy_part(to, id, number, from, etag, range).await?;
            Ok::<_, StoreError>(UploadedPart { number, etag })
        }
    });
    let done: Result<Vec<UploadedPart>, StoreError> =
        copies.buffered(COPY_PARTS_IN_FLIGHT).try_collect().await;
    let res = match done {
        Ok(parts) => store.complete_multipart(to, &id, &parts).await,
        Err(e) => Err(e),
    };
    if res.is_err() {
        // The first error is the one to report; an abort that fails too
        // leaves the upload pending in S3, as any client's crash would (a
        // lifecycle rule for incomplete uploads removes those).
        let _ = store.abort_multipart(to, &id).await;
    }
    res
}
