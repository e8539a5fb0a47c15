//! In-memory [`ObjectStore`] for unit tests of the logic above the store
//! (listing, prefetch windows). Never the only proof a feature works: the
//! integration tests run against a real S3 server through a real mount.

use std::collections::BTreeMap;
use std::ops::{Bound, Range};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;

use super::{
    ListPage, MAX_KEYS_PER_PAGE, ObjectMeta, ObjectStore, PendingUpload, StoreError, UploadedPart,
    WriteStore,
};

/// An open multipart upload: its key, and part number -> (bytes, ETag).
type MemUpload = (String, BTreeMap<u32, (Bytes, String)>);

/// A bucket in memory, with a counter per operation.
#[derive(Debug, Default)]
pub struct MemStore {
    objects: Mutex<BTreeMap<String, (Bytes, String)>>,
    next_etag: AtomicU64,
    /// ListObjectsV2 pages served.
    pub lists: AtomicU64,
    /// HeadObject calls served.
    pub heads: AtomicU64,
    /// Ranged GETs served.
    pub gets: AtomicU64,
    /// Bytes returned by ranged GETs.
    pub get_bytes: AtomicU64,
    /// Open multipart uploads by id.
    uploads: Mutex<BTreeMap<String, MemUpload>>,
    /// Write requests served (PUT, multipart, copy, delete).
    pub writes: AtomicU64,
}

impl MemStore {
    /// Stores `data` under `key` with a fresh ETag; returns the ETag.
    pub fn put(&self, key: &str, data: impl Into<Bytes>) -> String {
        let etag = format!("\"{}\"", self.next_etag.fetch_add(1, Ordering::Relaxed));
        self.objects
            .lock()
            .unwrap()
            .insert(key.to_string(), (data.into(), etag.clone()));
        etag
    }

    fn meta(key: &str, data: &Bytes, etag: &str) -> ObjectMeta {
        ObjectMeta {
            key: key.to_string(),
            size: data.len() as u64,
            etag: etag.to_string(),
            last_modified: SystemTime::UNIX_EPOCH,
        }
    }
}

impl ObjectStore for MemStore {
    async fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation: Option<String>,
        start_after: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, StoreError> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        let max = max_keys.clamp(1, MAX_KEYS_PER_PAGE) as usize;
        let objects = self.objects.lock().unwrap();
        let mut page = ListPage::default();
        let mut count = 0;
        let after = continuation
            .or(start_after.map(str::to_string))
            .unwrap_or_default();
        // Start at the larger of `prefix` (inclusive) and `after` (exclusive).
        let start = if after.as_str() >= prefix {
            Bound::Excluded(after.as_str())
        } else {
            Bound::Included(prefix)
        };
        for (key, (data, etag)) in objects.range::<str, _>((start, Bound::Unbounded)) {
            if !key.starts_with(prefix) {
                break;
            }
            let grouped = delimiter.and_then(|d| key[prefix.len()..].find(d).map(|i| (d, i)));
            let entry = match grouped {
                Some((d, i)) => key[..prefix.len() + i + d.len()].to_string(),
                None => key.clone(),
            };
            if entry.as_str() <= after.as_str() || page.common_prefixes.last() == Some(&entry) {
                continue;
            }
            if count == max {
                page.next_token = Some(after_last(&page));
                break;
            }
            count += 1;
            if grouped.is_none() {
                page.objects.push(Self::meta(key, data, etag));
            } else {
                page.common_prefixes.push(entry);
            }
        }
        Ok(page)
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.heads.fetch_add(1, Ordering::Relaxed);
        let objects = self.objects.lock().unwrap();
        let (data, etag) = objects.get(key).ok_or(StoreError::NotFound)?;
        Ok(Self::meta(key, data, etag))
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<Bytes, StoreError> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        let objects = self.objects.lock().unwrap();
        let (data, cur) = objects.get(key).ok_or(StoreError::NotFound)?;
        if !etag.is_empty() && etag != cur {
            return Err(StoreError::PreconditionFailed);
        }
        if range.start >= data.len() as u64 {
            return Err(StoreError::InvalidRange);
        }
        let end = range.end.min(data.len() as u64);
        self.get_bytes
            .fetch_add(end - range.start, Ordering::Relaxed);
        Ok(data.slice(range.start as usize..end as usize))
    }
}

/// S3's rules on parts are not checked here (part sizes, numbers): the
/// integration tests run against servers that check them.
impl WriteStore for MemStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<String, StoreError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(MemStore::put(self, key, data))
    }

    async fn create_multipart(&self, key: &str) -> Result<String, StoreError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let id = format!("u{}", self.next_etag.fetch_add(1, Ordering::Relaxed));
        let entry = (key.to_string(), BTreeMap::new());
        self.uploads.lock().unwrap().insert(id.clone(), entry);
        Ok(id)
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        data: Bytes,
    ) -> Result<String, StoreError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let etag = format!("\"p{}\"", self.next_etag.fetch_add(1, Ordering::Relaxed));
        let mut uploads = self.uploads.lock().unwrap();
        match uploads.get_mut(upload_id) {
            Some((k, parts)) if k == key => {
                parts.insert(number, (data, etag.clone()));
                Ok(etag)
            }
            _ => Err(StoreError::NoSuchUpload),
        }
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[UploadedPart],
    ) -> Result<String, StoreError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        // As in S3, a completion naming a bad part leaves the upload pending.
        let mut uploads = self.uploads.lock().unwrap();
        let (k, held) = uploads.get(upload_id).ok_or(StoreError::NoSuchUpload)?;
        let mut all = Vec::new();
        for p in parts {
            match held.get(&p.number) {
                Some((d, e)) if k == key && *e == p.etag => all.extend_from_slice(d),
                _ => return Err(StoreError::Other(format!("InvalidPart {}", p.number))),
            }
        }
        uploads.remove(upload_id);
        drop(uploads);
        Ok(MemStore::put(self, key, all))
    }

    async fn abort_multipart(&self, _key: &str, upload_id: &str) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.uploads.lock().unwrap().remove(upload_id);
        Ok(())
    }

    async fn list_multipart(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        Ok(self
            .uploads
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, (k, _))| k.starts_with(prefix))
            .map(|(id, (k, _))| PendingUpload {
                key: k.clone(),
                upload_id: id.clone(),
                initiated: SystemTime::UNIX_EPOCH,
            })
            .collect())
    }

    async fn copy(&self, from: &str, etag: &str, to: &str) -> Result<String, StoreError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let data = {
            let objects = self.objects.lock().unwrap();
            let (data, cur) = objects.get(from).ok_or(StoreError::NotFound)?;
            if !etag.is_empty() && etag != cur {
                return Err(StoreError::PreconditionFailed);
            }
            data.clone()
        };
        Ok(MemStore::put(self, to, data))
    }

    async fn copy_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        from: &str,
        etag: &str,
        range: Range<u64>,
    ) -> Result<String, StoreError> {
        let data = {
            let objects = self.objects.lock().unwrap();
            let (data, cur) = objects.get(from).ok_or(StoreError::NotFound)?;
            if !etag.is_empty() && etag != cur {
                return Err(StoreError::PreconditionFailed);
            }
            if range.end > data.len() as u64 || range.start >= range.end {
                return Err(StoreError::Other(format!(
                    "UploadPartCopy {from}: range {range:?} of {} bytes",
                    data.len()
                )));
            }
            data.slice(range.start as usize..range.end as usize)
        };
        self.upload_part(key, upload_id, number, data).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.objects.lock().unwrap().remove(key);
        Ok(())
    }
}

/// The largest key or prefix on `page`: listing resumes after it.
fn after_last(page: &ListPage) -> String {
    let obj = page.objects.last().map(|o| o.key.as_str()).unwrap_or("");
    let pre = page
        .common_prefixes
        .last()
        .map(String::as_str)
        .unwrap_or("");
    // A common prefix "p/" must skip every key under it: resume after "p/\u{10FFFF}".
    if pre > obj {
        format!("{pre}\u{10FFFF}")
    } else {
        obj.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn paginates_prefixes_and_objects_once_each() {
        let s = MemStore::default();
        for i in 0..25 {
            s.put(&format!("d/f{i:03}"), "x");
        }
        for i in 0..5 {
            s.put(&format!("d/sub{i}/a"), "x");
            s.put(&format!("d/sub{i}/b"), "x");
        }
        let mut names = Vec::new();
        let mut token = None;
        loop {
            let p = s.list_page("d/", Some("/"), token, None, 7).await.unwrap();
            names.extend(p.objects.into_iter().map(|o| o.key));
            names.extend(p.common_prefixes);
            token = p.next_token;
            if token.is_none() {
                break;
            }
        }
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "duplicates across pages");
        assert_eq!(names.len(), 30);
    }
}
