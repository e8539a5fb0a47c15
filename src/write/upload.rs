//! Uploading one staged file: one PutObject below the first part size,
//! else a multipart upload with parts sent concurrently under a mount-wide
//! memory bound.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::Semaphore;

use crate::store::{MAX_PART_SIZE, MAX_PARTS, ObjectStore, StoreError, UploadedPart, WriteStore};

/// Parts per size step of the part-size schedule: part `n` (1-based) is
/// `first << ((n - 1) / PARTS_PER_STEP)` bytes.
pub const PARTS_PER_STEP: u32 = 1_000;

/// Size of part `n` (1-based) when the first part is `first` bytes:
/// doubled every [`PARTS_PER_STEP`] parts, at most [`MAX_PART_SIZE`]. With
/// 8 MiB first parts 10,000 parts hold about 8 TiB, past S3's 5 TiB object
/// limit; the schedule does not depend on the object's final size.
pub fn part_size(first: u64, n: u32) -> u64 {
    let step = (n.saturating_sub(1) / PARTS_PER_STEP).min(30);
    (first << step).min(MAX_PART_SIZE)
}

/// The part (1-based) holding byte `off` under the schedule of
/// [`part_size`] with first parts of `first` bytes, and its byte range
/// `(number, offset, len)` were the object large enough.
pub fn part_at(first: u64, off: u64) -> (u32, u64, u64) {
    let mut base = 0u64;
    let mut n0 = 0u32;
    loop {
        let size = part_size(first, n0 + 1);
        let span = size * PARTS_PER_STEP as u64;
        if off < base + span || size == MAX_PART_SIZE {
            let i = ((off - base) / size) as u32;
            return (n0 + i + 1, base + i as u64 * size, size);
        }
        base += span;
        n0 += PARTS_PER_STEP;
    }
}

/// Byte ranges `(number, offset, len)` of the parts of an object of `size`
/// bytes. Errors: more than [`MAX_PARTS`] parts would be needed.
pub fn parts(first: u64, size: u64) -> Result<Vec<(u32, u64, u64)>, StoreError> {
    let mut out = Vec::new();
    let (mut off, mut n) = (0u64, 1u32);
    while off < size {
        if n > MAX_PARTS {
            return Err(StoreError::Other(format!(
                "{size} bytes need more than {MAX_PARTS} parts"
            )));
        }
        let len = part_size(first, n).min(size - off);
        out.push((n, off, len));
        off += len;
        n += 1;
    }
    Ok(out)
}

/// What uploads share on one mount.
pub struct Uploader<S> {
    /// The store.
    pub store: Arc<S>,
    /// First part size, bytes (`write.part_size`).
    pub part_size: u64,
    /// Bytes of part buffers in flight, in KiB permits.
    memory: Semaphore,
    /// Permits `memory` was created with.
    memory_kib: u32,
}

impl<S: ObjectStore + WriteStore> Uploader<S> {
    /// Uploads to `store` with first parts of `part_size` bytes and at most
    /// `memory` bytes of part buffers in flight on the mount.
    pub fn new(store: Arc<S>, part_size: u64, memory: u64) -> Self {
        let kib = (memory / 1024).clamp(1, u32::MAX as u64 >> 4) as u32;
        Self {
            store,
            part_size,
            memory: Semaphore::new(kib as usize),
            memory_kib: kib,
        }
    }

    /// PutObject of the `size` bytes of `file` as `key`: the new ETag.
    /// Errors: the store's (after its retries) or the local file's, as
    /// [`StoreError::Other`].
    pub async fn put(&self, key: &str, file: &Arc<File>, size: u64) -> Result<String, StoreError> {
        let _mem = self.reserve(size).await;
        let data = read_at(file, 0, size).await?;
        self.store.put(key, data).await
    }

    /// UploadPart `n` of upload `id` of `key`: `len` bytes of `file` at
    /// `off`, within the memory bound. The part's ETag.
    pub async fn send_part(
        &self,
        key: &str,
        id: &str,
        file: &Arc<File>,
        (n, off, len): (u32, u64, u64),
    ) -> Result<String, StoreError> {
        let _mem = self.reserve(len).await;
        let data = read_at(file, off, len).await?;
        self.store.upload_part(key, id, n, data).await
    }

    /// CompleteMultipartUpload of `parts`: the ETag. A NoSuchUpload answer
    /// (the retry of a completion whose answer was lost) is a success when
    /// the object's ETag is the one these parts make.
    pub async fn complete(
        &self,
        key: &str,
        id: &str,
        parts: &[UploadedPart],
    ) -> Result<String, StoreError> {
        match self.store.complete_multipart(key, id, parts).await {
            Err(StoreError::NoSuchUpload) => {
                let want = multipart_etag(parts);
                match self.store_etag(key).await {
                    Some(e) if Some(e.trim_matches('"')) == want.as_deref() => Ok(e),
                    _ => Err(StoreError::NoSuchUpload),
                }
            }
            other => other,
        }
    }

    /// AbortMultipartUpload, a failure logged (S3 lifecycle rules or the
    /// next start clean up).
    pub async fn abort(&self, key: &str, id: &str) {
        if let Err(e) = self.store.abort_multipart(key, id).await {
            tracing::warn!(key = %key.escape_debug(), upload_id = %id,
                "aborting a multipart upload failed: {e}");
        }
    }

    /// The ETag S3 holds for `key` now (HeadObject), if any.
    async fn store_etag(&self, key: &str) -> Option<String> {
        self.store.head(key).await.ok().map(|m| m.etag)
    }

    /// Waits until `bytes` more of part buffers fit the memory bound (a
    /// buffer larger than the whole bound takes all of it).
    async fn reserve(&self, bytes: u64) -> tokio::sync::SemaphorePermit<'_> {
        let kib = bytes.div_ceil(1024).clamp(1, self.memory_kib as u64) as u32;
        self.memory
            .acquire_many(kib)
            .await
            .expect("the semaphore is never closed")
    }
}

/// Parts of one upload in flight at most (the memory bound also applies).
pub const MAX_PARTS_IN_FLIGHT: usize = 16;

/// Reads `len` bytes at `off` of `file` on the blocking pool.
async fn read_at(file: &Arc<File>, off: u64, len: u64) -> Result<Bytes, StoreError> {
    let file = file.clone();
    tokio::task::spawn_blocking(move || {
        let mut buf = BytesMut::zeroed(len as usize);
        file.read_exact_at(&mut buf, off)?;
        Ok::<_, std::io::Error>(buf.freeze())
    })
    .await
    .map_err(|e| StoreError::Other(format!("reading staged data: {e}")))?
    .map_err(|e| StoreError::Other(format!("reading staged data: {e}")))
}

/// The ETag S3 gives an object completed from `parts` (without quotes): the
/// MD5 of the parts' binary MD5s, `-`, the part count. `None` when a part's
/// ETag is not a hex MD5 (a server with other ETags).
pub fn multipart_etag(parts: &[UploadedPart]) -> Option<String> {
    use md5::Digest;
    let mut h = md5::Md5::new();
    for p in parts {
        let hex = p.etag.trim_matches('"');
        if hex.len() != 32 {
            return None;
        }
        for i in 0..16 {
            h.update([u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?]);
        }
    }
    let digest = h.finalize();
    let mut s: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    s.push_str(&format!("-{}", parts.len()));
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_sizes_double_every_thousand_parts_and_fit_5_tib() {
        let first = 8 << 20;
        assert_eq!(part_size(first, 1), 8 << 20);
        assert_eq!(part_size(first, 1000), 8 << 20);
        assert_eq!(part_size(first, 1001), 16 << 20);
        assert_eq!(part_size(first, 10_000), (8u64 << 20) << 9);
        let five_tib = 5u64 << 40;
        let p = parts(first, five_tib).unwrap();
        assert!(p.len() <= MAX_PARTS as usize);
        assert_eq!(p.iter().map(|x| x.2).sum::<u64>(), five_tib);
        assert!(p.windows(2).all(|w| w[0].1 + w[0].2 == w[1].1));
        assert_eq!(parts(first, 0).unwrap(), vec![]);
        assert_eq!(parts(first, 1).unwrap(), vec![(1, 0, 1)]);
        assert!(parts(5 << 20, 100u64 << 40).is_err());
        // part_at agrees with the schedule everywhere.
        for &(n, off, len) in p.iter().step_by(997).chain(p.last()) {
            for o in [off, off + len / 2, off + len - 1] {
                let (m, moff, mlen) = part_at(first, o);
                assert_eq!((m, moff), (n, off));
                assert!(mlen >= len);
            }
        }
    }

    #[test]
    fn multipart_etags_are_the_md5_of_the_part_md5s() {
        // Two parts whose MD5s are those of "a" and "b".
        let parts = [
            UploadedPart {
                number: 1,
                etag: "\"0cc175b9c0f1b6a831c399e269772661\"".into(),
            },
            UploadedPart {
                number: 2,
                etag: "92eb5ffee6ae2fec3ad71c777531578f".into(),
            },
        ];
        // md5(md5("a") || md5("b")), computed independently with Python's hashlib.
        assert_eq!(
            multipart_etag(&parts).unwrap(),
            "96e024ba2074fe77e8e965ba43a704be-2"
        );
        let odd = [UploadedPart {
            number: 1,
            etag: "\"p1\"".into(),
        }];
        assert_eq!(multipart_etag(&odd), None);
    }
}
