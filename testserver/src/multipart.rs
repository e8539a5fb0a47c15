//! Multipart uploads held in memory until completed or aborted, with S3's
//! rules: part numbers 1 to 10,000, every part but the last at least 5 MiB,
//! a completion that names parts in ascending order with their ETags, and
//! the object's ETag the MD5 of the parts' MD5s followed by `-N` (what AWS
//! and MinIO return; "Amazon S3 multipart upload limits" and "Checking
//! object integrity" in the Amazon S3 User Guide).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use md5::{Digest, Md5};

/// Highest part number (S3 limit).
pub const MAX_PARTS: i32 = 10_000;
/// Smallest size of any part but the last, bytes (S3 limit: 5 MiB).
pub const MIN_PART_SIZE: usize = 5 << 20;

/// Why a multipart request was refused, as S3 names it.
#[derive(Debug, PartialEq, Eq)]
pub enum UploadError {
    /// The upload id is not an open upload of this bucket and key.
    NoSuchUpload,
    /// A part number outside 1..=10,000.
    InvalidPartNumber,
    /// A completion names a part not uploaded, or with another ETag.
    InvalidPart,
    /// A completion's parts are not in ascending order, or it names none.
    InvalidPartOrder,
    /// A part but the last is smaller than [`MIN_PART_SIZE`].
    EntityTooSmall,
}

/// One open upload.
#[derive(Debug)]
struct Upload {
    bucket: String,
    key: String,
    initiated: SystemTime,
    /// Part number -> (bytes, raw MD5).
    parts: BTreeMap<i32, (Bytes, [u8; 16])>,
}

/// An open upload as ListMultipartUploads shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenUpload {
    pub key: String,
    pub upload_id: String,
    pub initiated: SystemTime,
}

/// Every open upload of the server.
#[derive(Debug, Default)]
pub struct Uploads {
    open: Mutex<HashMap<String, Upload>>,
    next_id: AtomicU64,
}

fn md5_of(data: &[u8]) -> [u8; 16] {
    Md5::digest(data).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Uploads {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Upload>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens an upload of `key` in `bucket`; returns its id.
    pub fn create(&self, bucket: &str, key: &str) -> String {
        let id = format!("upload-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        self.lock().insert(
            id.clone(),
            Upload {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                initiated: SystemTime::now(),
                parts: BTreeMap::new(),
            },
        );
        id
    }

    fn check<'a>(
        open: &'a mut HashMap<String, Upload>,
        bucket: &str,
        key: &str,
        id: &str,
    ) -> Result<&'a mut Upload, UploadError> {
        match open.get_mut(id) {
            Some(u) if u.bucket == bucket && u.key == key => Ok(u),
            _ => Err(UploadError::NoSuchUpload),
        }
    }

    /// Stores part `number` (replacing an earlier one of that number);
    /// returns its quoted ETag.
    pub fn put_part(
        &self,
        bucket: &str,
        key: &str,
        id: &str,
        number: i32,
        data: Bytes,
    ) -> Result<String, UploadError> {
        if !(1..=MAX_PARTS).contains(&number) {
            return Err(UploadError::InvalidPartNumber);
        }
        let md5 = md5_of(&data);
        let mut open = self.lock();
        let u = Self::check(&mut open, bucket, key, id)?;
        u.parts.insert(number, (data, md5));
        Ok(format!("\"{}\"", hex(&md5)))
    }

    /// Completes the upload from `parts` (number, ETag with or without
    /// quotes): returns the object's bytes and quoted ETag, and closes the
    /// upload. A refused completion leaves the upload open, as in S3.
    pub fn complete(
        &self,
        bucket: &str,
        key: &str,
        id: &str,
        parts: &[(i32, String)],
    ) -> Result<(Bytes, String), UploadError> {
        let mut open = self.lock();
        let u = Self::check(&mut open, bucket, key, id)?;
        if parts.is_empty() || parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(UploadError::InvalidPartOrder);
        }
        let mut chosen = Vec::with_capacity(parts.len());
        for (number, etag) in parts {
            let (data, md5) = u.parts.get(number).ok_or(UploadError::InvalidPart)?;
            if etag.trim_matches('"') != hex(md5) {
                return Err(UploadError::InvalidPart);
            }
            chosen.push((data.clone(), *md5));
        }
        if chosen[..chosen.len() - 1]
            .iter()
            .any(|(d, _)| d.len() < MIN_PART_SIZE)
        {
            return Err(UploadError::EntityTooSmall);
        }
        let mut all = BytesMut::with_capacity(chosen.iter().map(|(d, _)| d.len()).sum());
        let mut md5s = Vec::with_capacity(chosen.len() * 16);
        for (d, md5) in &chosen {
            all.extend_from_slice(d);
            md5s.extend_from_slice(md5);
        }
        let etag = format!("\"{}-{}\"", hex(&md5_of(&md5s)), chosen.len());
        open.remove(id);
        Ok((all.freeze(), etag))
    }

    /// Closes the upload and drops its parts.
    pub fn abort(&self, bucket: &str, key: &str, id: &str) -> Result<(), UploadError> {
        let mut open = self.lock();
        Self::check(&mut open, bucket, key, id)?;
        open.remove(id);
        Ok(())
    }

    /// Open uploads of `bucket` whose key starts with `prefix`, by key.
    pub fn list(&self, bucket: &str, prefix: &str) -> Vec<OpenUpload> {
        let mut out: Vec<OpenUpload> = self
            .lock()
            .iter()
            .filter(|(_, u)| u.bucket == bucket && u.key.starts_with(prefix))
            .map(|(id, u)| OpenUpload {
                key: u.key.clone(),
                upload_id: id.clone(),
                initiated: u.initiated,
            })
            .collect();
        out.sort_by(|a, b| (&a.key, a.initiated).cmp(&(&b.key, b.initiated)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completed_upload_joins_its_parts_with_the_multipart_etag() {
        let u = Uploads::default();
        let id = u.create("b", "k");
        let big = Bytes::from(vec![7u8; MIN_PART_SIZE]);
        let e1 = u.put_part("b", "k", &id, 1, big.clone()).unwrap();
        let e2 = u
            .put_part("b", "k", &id, 2, Bytes::from_static(b"end"))
            .unwrap();
        assert_eq!(
            u.complete("b", "k", &id, &[(2, e2.clone()), (1, e1.clone())]),
            Err(UploadError::InvalidPartOrder)
        );
        assert_eq!(
            u.complete("b", "k", &id, &[(1, e2.clone())]),
            Err(UploadError::InvalidPart)
        );
        let (data, etag) = u.complete("b", "k", &id, &[(1, e1), (2, e2)]).unwrap();
        assert_eq!(data.len(), MIN_PART_SIZE + 3);
        assert!(etag.ends_with("-2\""), "{etag}");
        assert_eq!(u.abort("b", "k", &id), Err(UploadError::NoSuchUpload));
    }

    #[test]
    fn a_small_part_before_the_last_is_refused() {
        let u = Uploads::default();
        let id = u.create("b", "k");
        let e1 = u
            .put_part("b", "k", &id, 1, Bytes::from_static(b"x"))
            .unwrap();
        let e2 = u
            .put_part("b", "k", &id, 2, Bytes::from_static(b"y"))
            .unwrap();
        assert_eq!(
            u.complete("b", "k", &id, &[(1, e1), (2, e2)]),
            Err(UploadError::EntityTooSmall)
        );
        assert_eq!(u.list("b", "").len(), 1, "still open");
        assert_eq!(
            u.put_part("b", "k", &id, 10_001, Bytes::new()),
            Err(UploadError::InvalidPartNumber)
        );
    }
}
