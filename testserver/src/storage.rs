//! In-memory object storage: buckets of `key -> Object`, ordered by key bytes.
//!
//! Keys are arbitrary UTF-8 strings. Because the map is flat, `a` and `a/x`, `a/`,
//! `//` or `a/./b` can all coexist, as in S3. The ETag (quoted hex MD5) is computed
//! once when an object is stored, never on reads.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;
use std::time::SystemTime;

use bytes::Bytes;
use md5::{Digest, Md5};

/// One stored object.
#[derive(Debug, Clone)]
pub struct Object {
    /// The object's content.
    pub data: Bytes,
    /// Quoted hex MD5 of `data`, e.g. `"d41d8cd98f00b204e9800998ecf8427e"`.
    pub etag: String,
    /// Time of the PUT (or the time given to `put_with_mtime`).
    pub last_modified: SystemTime,
}

impl Object {
    /// Builds an object, computing its ETag.
    pub fn new(data: Bytes, last_modified: SystemTime) -> Self {
        let etag = quoted_md5(&data);
        Object {
            data,
            etag,
            last_modified,
        }
    }

    /// The ETag without its quotes.
    pub fn etag_value(&self) -> &str {
        self.etag.trim_matches('"')
    }
}

/// Quoted lowercase hex MD5 of `data`.
pub fn quoted_md5(data: &[u8]) -> String {
    let digest = Md5::digest(data);
    let mut s = String::with_capacity(34);
    s.push('"');
    for b in digest.iter() {
        s.push_str(&format!("{b:02x}"));
    }
    s.push('"');
    s
}

#[derive(Debug)]
struct Bucket {
    created: SystemTime,
    objects: BTreeMap<String, Object>,
}

/// Why a storage operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageError {
    /// The bucket does not exist.
    NoSuchBucket,
    /// The key does not exist in the bucket.
    NoSuchKey,
    /// The bucket already exists (CreateBucket).
    BucketExists,
    /// The bucket is not empty (DeleteBucket).
    BucketNotEmpty,
}

/// One entry of a listing page: either an object or a common prefix.
#[derive(Debug, Clone)]
pub enum ListEntry {
    /// An object under the prefix.
    Object(String, Object),
    /// A common prefix (prefix + text up to and including the delimiter).
    CommonPrefix(String),
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    /// Objects and common prefixes, in lexicographic byte order.
    pub entries: Vec<ListEntry>,
    /// `Some(marker)` when more entries follow; listing again with `after = marker`
    /// returns the next page.
    pub next_marker: Option<String>,
}

/// All buckets, behind one mutex that is only held for short map operations.
#[derive(Debug, Default)]
pub struct Storage {
    buckets: Mutex<BTreeMap<String, Bucket>>,
}

impl Storage {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bucket>> {
        // A panic while holding the lock cannot leave the maps half-updated, so
        // poisoning is ignored.
        self.buckets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates a bucket; `BucketExists` if it is already there.
    pub fn create_bucket(&self, name: &str) -> Result<(), StorageError> {
        let mut b = self.lock();
        if b.contains_key(name) {
            return Err(StorageError::BucketExists);
        }
        b.insert(
            name.to_owned(),
            Bucket {
                created: SystemTime::now(),
                objects: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Deletes an empty bucket.
    pub fn delete_bucket(&self, name: &str) -> Result<(), StorageError> {
        let mut b = self.lock();
        let bucket = b.get(name).ok_or(StorageError::NoSuchBucket)?;
        if !bucket.objects.is_empty() {
            return Err(StorageError::BucketNotEmpty);
        }
        b.remove(name);
        Ok(())
    }

    /// Whether the bucket exists.
    pub fn bucket_exists(&self, name: &str) -> bool {
        self.lock().contains_key(name)
    }

    /// All buckets with their creation times, sorted by name.
    pub fn list_buckets(&self) -> Vec<(String, SystemTime)> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.created))
            .collect()
    }

    /// Stores an object (the ETag is computed before the lock is taken) and returns
    /// its quoted ETag.
    pub fn put(
        &self,
        bucket: &str,
        key: &str,
        data: Bytes,
        mtime: SystemTime,
    ) -> Result<String, StorageError> {
        let obj = Object::new(data, mtime);
        let etag = obj.etag.clone();
        let mut b = self.lock();
        let bucket = b.get_mut(bucket).ok_or(StorageError::NoSuchBucket)?;
        bucket.objects.insert(key.to_owned(), obj);
        Ok(etag)
    }

    /// Stores an object under a given quoted ETag (a completed multipart
    /// upload's, which is not the MD5 of its bytes).
    pub fn put_with_etag(
        &self,
        bucket: &str,
        key: &str,
        data: Bytes,
        etag: String,
        mtime: SystemTime,
    ) -> Result<(), StorageError> {
        let obj = Object {
            data,
            etag,
            last_modified: mtime,
        };
        let mut b = self.lock();
        let bucket = b.get_mut(bucket).ok_or(StorageError::NoSuchBucket)?;
        bucket.objects.insert(key.to_owned(), obj);
        Ok(())
    }

    /// Returns a clone of the object (cheap: the data is a `Bytes`).
    pub fn get(&self, bucket: &str, key: &str) -> Result<Object, StorageError> {
        let b = self.lock();
        let bucket = b.get(bucket).ok_or(StorageError::NoSuchBucket)?;
        bucket
            .objects
            .get(key)
            .cloned()
            .ok_or(StorageError::NoSuchKey)
    }

    /// Removes an object. Deleting a missing key succeeds, as in S3.
    pub fn delete(&self, bucket: &str, key: &str) -> Result<(), StorageError> {
        let mut b = self.lock();
        let bucket = b.get_mut(bucket).ok_or(StorageError::NoSuchBucket)?;
        bucket.objects.remove(key);
        Ok(())
    }

    /// Lists up to `max` entries under `prefix` that sort after `after`.
    ///
    /// With a delimiter, keys whose remainder after `prefix` contains it are rolled
    /// up into one common prefix each; a common prefix counts as one entry. The
    /// sequence of entries (objects and common prefixes) is strictly increasing, so
    /// `after` may be the last key or the last common prefix of a previous page and
    /// every entry is returned exactly once across pages.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        after: Option<&str>,
        max: usize,
    ) -> Result<ListPage, StorageError> {
        let b = self.lock();
        let bucket = b.get(bucket).ok_or(StorageError::NoSuchBucket)?;
        let delimiter = delimiter.filter(|d| !d.is_empty());

        // Start at the larger of `prefix` (inclusive) and `after` (exclusive).
        let start: Bound<&str> = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };

        let mut page = ListPage::default();
        let mut last: Option<String> = None;
        for (key, obj) in bucket.objects.range::<str, _>((start, Bound::Unbounded)) {
            if !key.starts_with(prefix) {
                break;
            }
            let group: Option<&str> = delimiter.and_then(|d| {
                key[prefix.len()..]
                    .find(d)
                    .map(|i| &key[..prefix.len() + i + d.len()])
            });
            let name = group.unwrap_or(key);
            // Entries already returned on an earlier page (a common prefix equal to
            // or before the marker) or on this page are skipped.
            if after.is_some_and(|a| name <= a) || last.as_deref() == Some(name) {
                continue;
            }
            if page.entries.len() >= max {
                page.next_marker = last;
                return Ok(page);
            }
            page.entries.push(match group {
                Some(g) => ListEntry::CommonPrefix(g.to_owned()),
                None => ListEntry::Object(key.clone(), obj.clone()),
            });
            last = Some(name.to_owned());
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &ListPage) -> Vec<String> {
        p.entries
            .iter()
            .map(|e| match e {
                ListEntry::Object(k, _) => k.clone(),
                ListEntry::CommonPrefix(p) => format!("P:{p}"),
            })
            .collect()
    }

    #[test]
    fn etag_of_empty() {
        assert_eq!(quoted_md5(b""), "\"d41d8cd98f00b204e9800998ecf8427e\"");
    }

    #[test]
    fn file_and_dir_coexist_and_pagination_is_exact() {
        let s = Storage::default();
        s.create_bucket("b").unwrap();
        for k in ["a", "a/x", "a/y", "a!", "a0", "b/c/d", "b/e", "c"] {
            s.put("b", k, Bytes::from_static(b"1"), SystemTime::now())
                .unwrap();
        }
        let all = s.list("b", "", Some("/"), None, 1000).unwrap();
        assert_eq!(names(&all), ["a", "a!", "P:a/", "a0", "P:b/", "c"]);
        // One entry per page: the same sequence, each exactly once.
        let mut after = None;
        let mut seen = Vec::new();
        loop {
            let p = s.list("b", "", Some("/"), after.as_deref(), 1).unwrap();
            seen.extend(names(&p));
            match p.next_marker {
                Some(m) => after = Some(m),
                None => break,
            }
        }
        assert_eq!(seen, names(&all));
        let sub = s.list("b", "b/", Some("/"), None, 1000).unwrap();
        assert_eq!(names(&sub), ["P:b/c/", "b/e"]);
    }
}
